"""Ships the repository's ``docs/*.md`` inside the wheel as ``relmem/docs`` (``relmem docs``).

Everything else is declared in ``pyproject.toml``; only this mapping of a package onto a
folder outside ``src/`` needs ``setup.py``, so the repository keeps one copy of the docs.
"""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages("src"), "relmem.docs"],
    package_dir={"": "src", "relmem.docs": "docs"},
    package_data={
        "relmem": [
            "py.typed",
            "cores/rmc/csrc/*.cpp",
            "cores/dnc/csrc/*.cpp",
            "cores/csrc/*.h",
            "cores/csrc/*.cpp",
        ],
        "relmem.docs": ["*.md"],
    },
)
