"""What a CUDA allocator peak holds: record the allocator's history while some work runs, replay it to the moment of
the largest allocated total, and group the blocks live then by the code that allocated them.

    start()                                  # before anything is allocated on the device
    ...work...
    summary = at_peak(torch.cuda.memory._snapshot(), device_index)
    print(table(summary))

A site is the innermost Python frame outside torch's own package (a model's line, a kernel wrapper, an Inductor
output file), so that a compiled layer's saved activations group by layer code and an optimizer's states by the
optimizer's line. Frees count when the allocator completes them (a block freed on one stream but used on another
stays live until that stream passes the free).
"""

from __future__ import annotations

from collections import defaultdict

MAX_ENTRIES = 3_000_000  # allocator events kept; a run of more events loses its oldest and is marked truncated
GIB = 2**30


def start(max_entries: int = MAX_ENTRIES) -> None:
    """Record every allocation and free of the CUDA caching allocator with its Python stack from now on."""
    import torch

    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=max_entries)


def _site(frames: list[dict]) -> str:
    """The innermost frame outside torch's package: 'folder/file.py:line function'."""
    for frame in frames:
        name = frame.get("filename", "")
        if "/torch/" not in name and not name.startswith("<") and name:
            return f"{'/'.join(name.split('/')[-2:])}:{frame.get('line')} {frame.get('name')}"
    return "torch internals"


def at_peak(snapshot: dict, device: int, top: int = 20) -> dict:
    """The peak of ``snapshot``'s trace on ``device`` (bytes allocated, summed over alloc and completed-free events)
    and the blocks live at it grouped by ``_site``, largest first: {"peak_gib", "events", "truncated", "sites":
    [{"site", "gib", "blocks"}]}."""
    trace = snapshot["device_traces"][device]
    current = peak = 0
    peak_at = -1
    for index, event in enumerate(trace):
        if event["action"] == "alloc":
            current += event["size"]
        elif event["action"] == "free_completed":
            current -= event["size"]
        if current > peak:
            peak, peak_at = current, index
    live: dict[int, dict] = {}
    for event in trace[:peak_at + 1]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
        elif event["action"] == "free_completed":
            live.pop(event["addr"], None)
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for event in live.values():
        site = sites[_site(event.get("frames", []))]
        site[0] += event["size"]
        site[1] += 1
    ranked = sorted(sites.items(), key=lambda item: -item[1][0])
    return {"peak_gib": peak / GIB, "events": len(trace), "truncated": len(trace) >= MAX_ENTRIES,
            "sites": [{"site": name, "gib": size / GIB, "blocks": count} for name, (size, count) in ranked[:top]]}


def table(summary: dict) -> str:
    """The sites of ``at_peak`` as lines: GiB, blocks, site."""
    head = (f"allocated at the peak: {summary['peak_gib']:.2f} GiB over {summary['events']} allocator events"
            + (" (truncated: the oldest events were lost)" if summary["truncated"] else ""))
    return "\n".join([head] + [f"{s['gib']:9.3f} GiB {s['blocks']:6d}  {s['site']}" for s in summary["sites"]])
