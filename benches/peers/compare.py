#!/usr/bin/env python3
"""Merges GPU bench JSON files (benches/gpu) with torch_mp.py's JSON into one markdown table of
frames/s per consumer, gpuring against torch.multiprocessing, Block policy, same frame sizes.

    python3 benches/peers/compare.py --torch torch.json gpu-mps-off.json gpu-mps-on.json
"""
import argparse
import json


def label(size):
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch", required=True, help="torch_mp.py --json output")
    ap.add_argument("gpu", nargs="+", help="benches/gpu --json outputs (one per MPS mode)")
    args = ap.parse_args()
    torch_rows = {(r["consumers"], r["size"]): r for r in json.load(open(args.torch))}
    runs = [json.load(open(p)) for p in args.gpu]
    head = "| consumers | size | torch.mp fps/consumer |"
    rule = "|---|---|---|"
    for run in runs:
        head += f" gpuring {run['label']} | ratio |"
        rule += "---|---|"
    print("### gpuring vs torch.multiprocessing (frames/s per consumer, Block)\n")
    print(head)
    print(rule)
    for (n, size), t in sorted(torch_rows.items()):
        line = f"| {n} | {label(size)} | {t['fps_per_consumer_mean']:.0f} |"
        for run in runs:
            cell = next((c for c in run["cells"] if c["consumers"] == n and c["size"] == size
                         and c["policy"] == "block"), None)
            if cell is None:
                line += " - | - |"
                continue
            fps = sum(cell["consumer_fps"]) / len(cell["consumer_fps"])
            line += f" {fps:.0f} | {fps / t['fps_per_consumer_mean']:.0f}x |"
        print(line)


if __name__ == "__main__":
    main()
