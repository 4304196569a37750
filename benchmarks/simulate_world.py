"""`genrank simulate` on a preset, timed: wall, peak RSS, and a floor measured in the same run.

    python benchmarks/simulate_world.py --preset large --out /tmp/genrank-large

Runs transforms.simulator.simulate (what `genrank simulate` runs) once, then, as the floor, compresses the
landed lines again with the landing zone's own gzip settings: the part of the work no simulator can skip.
The wall as a multiple of that floor holds on a loaded machine better than the wall itself.
Target (issue #35): the `large` world (7,000 users, 21 days) in at most 5 minutes.
"""

from __future__ import annotations

import argparse
import gzip
import resource
import sys
import time
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from transforms.simulator import resolve_config, simulate  # noqa: E402


def compression_floor(root: Path) -> tuple[float, int]:
    """Seconds to compress every landed file's lines again at the landing zone's level, and their bytes."""
    seconds, size = 0.0, 0
    for path in sorted((root / "landing").rglob("*.jsonl.gz")):
        data = gzip.decompress(path.read_bytes())
        started = time.perf_counter()
        zlib.compress(data, 6)
        seconds += time.perf_counter() - started
        size += len(data)
    return seconds, size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="large")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--days", type=int, default=None, help="simulate fewer days than the preset's")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    config = resolve_config(args.preset, n_days=args.days) if args.days else resolve_config(args.preset)
    started = time.perf_counter()
    report = simulate(preset=args.preset, seed=args.seed, out=args.out, config=config)
    wall = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    floor, size = compression_floor(args.out)
    user_days = config.n_users * config.n_days
    print(report.summary())
    print(f"\n| preset | users x days | lines | landed MB | wall | per 1,000 user-days | x compression floor | peak RSS |")
    print("|---|---|---|---|---|---|---|---|")
    lines = report.impressions + report.clicks + report.behaviors
    print(f"| {args.preset} | {config.n_users:,} x {config.n_days} | {lines:,} | {size / 1e6:,.0f} | {wall:.0f} s | "
          f"{wall / user_days * 1000:.2f} s | x{wall / floor:.0f} ({floor:.1f} s) | {peak_mib:,.0f} MiB |")


if __name__ == "__main__":
    main()
