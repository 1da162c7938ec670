"""``loongsage csv-tail RUN_DIR``: print the last rows the csv tracker wrote, to show the command contract."""

import argparse
import csv
from pathlib import Path


def main(argv, registries):
    parser = argparse.ArgumentParser(prog="loongsage csv-tail", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("-n", type=int, default=5, help="rows to print (default 5)")
    parser.add_argument("--filename", default=registries.tracker.entry("csv").params().filename)
    args = parser.parse_args(argv)
    path = args.run_dir / args.filename
    if not path.is_file():
        print(f"error: {path} does not exist (was the run logged with the csv tracker?)")
        return 2
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    for row in [rows[0], *rows[1:][-args.n:]]:
        print("\t".join(row))
    return 0
