import relmem


def test_all_names_resolve():
    for name in relmem.__all__:
        assert hasattr(relmem, name), name


def test_public_api_is_what_we_document():
    expected = {
        "RMCConfig",
        "RMCState",
        "RMCStepDetails",
        "RelationalMemory",
        "RelationalMemoryCell",
        "__version__",
        "detach_state",
        "sonnet",
    }
    assert expected <= set(relmem.__all__)


def test_help_documents_every_argument_with_shapes():
    import inspect

    doc = inspect.getdoc(relmem.RelationalMemory) or ""
    for name in inspect.signature(relmem.RelationalMemory).parameters:
        assert name in doc, f"RelationalMemory's docstring does not mention {name!r}"
    assert "[T, B, F]" in doc and "[B, N, M]" in doc and "[T, B, N·M]" in doc


def test_rmc_package_exports_resolve():
    import relmem.cores.rmc as rmc

    for name in rmc.__all__:
        assert hasattr(rmc, name), name
    assert rmc.RelationalMemory is relmem.RelationalMemory
    assert {"FastRelationalMemory", "RMCWeights", "fast_path_plan", "step_flops"} <= set(
        rmc.__all__
    )
