"""``sparse-dist`` with a third party's registrations: ``python with_third_party.py COMMAND ...`` imports
:mod:`third_party` (a layer kind and a staleness rule) and then runs the command line as ``sparse-dist`` does.

Registration has to come before the command's modules are imported (``--layer-kind``'s choices are the kinds
registered then), so this script imports nothing of the project before :mod:`third_party`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import third_party  # noqa: E402,F401  (registers gin-like and every-third)
from runners.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
