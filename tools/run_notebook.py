"""Executes a notebook with nbclient and fails (exit 1) if a cell errors; with a second
path, writes the executed notebook there (how examples/fpt-in-a-notebook.ipynb's committed
outputs are made). CI runs it on a copy: .ci/run, the Python package's stage.
    python tools/run_notebook.py examples/fpt-in-a-notebook.ipynb [OUT.ipynb]"""

import sys
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
start = time.time()
try:
    NotebookClient(nb, timeout=1800, kernel_name="python3").execute()
except CellExecutionError as e:
    print(f"{path}: a cell failed:\n{e}", file=sys.stderr)
    sys.exit(1)
if len(sys.argv) > 2:
    nbformat.write(nb, sys.argv[2])
print(f"{path}: every cell ran, in {time.time() - start:.0f} s")
