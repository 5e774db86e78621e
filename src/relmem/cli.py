"""The ``relmem`` command: a thin dispatcher to one module per sub-command.

Each sub-command lives in its own module and exposes ``main(argv: list[str]) -> int``; the
table below is the only place that knows them all, so the CLI stays a table of contents.
"""

from __future__ import annotations

import importlib
import os
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module exposing main(argv) -> int, one-line help)
    "demo": ("relmem.commands.demo", "build an RMC and run a batch of random sequences through it"),
    "train": ("relmem.commands.train", "train a model on a task (relmem train nth-farthest)"),
    "eval": ("relmem.commands.evaluate", "held-out metric of a run, broken down by group"),
    "generate": ("relmem.commands.generate", "sample text from a trained language model"),
    "answer": ("relmem.commands.answer", "answer a question about a text with a trained reader"),
    "plot": ("relmem.commands.plot", "learning curves and RMC attention maps of a run (PNG)"),
    "play": ("relmem.commands.play", "render episodes of a trained RL agent (GIF or PNG strip)"),
    "export": ("relmem.commands.export", "a trained model as a folder to share (and to the Hub)"),
    "bench": ("relmem.commands.bench", "time the RMC (reference, fast) against nn.LSTM; to JSON"),
    "docs": ("relmem.commands.docs", "the pages cited as docs/PAGE.md §N: relmem docs PAGE N"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: relmem COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `relmem COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``relmem`` console script."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        from relmem import __version__

        print(f"relmem {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        known = ", ".join(COMMANDS)
        print(f"relmem: error: unknown command {name!r}; commands: {known}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:  # Ctrl-C while starting, or a second one while training
        print(f"\nrelmem {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (relmem eval RUN | head -1): say nothing
        # Python would complain again while flushing stdout at exit: point it at devnull
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a process the signal ended


if __name__ == "__main__":
    sys.exit(main())
