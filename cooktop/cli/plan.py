"""``cooktop plan``: where each layer would go and what it costs, without loading anything."""

from __future__ import annotations

import json

import click
from tabulate import tabulate

from ..backends import registry
from ..errors import CooktopError
from ..format.gguf import open_gguf
from ..format.kvtypes import KVConfig, kv_type_name
from ..model.config import load_config
from ..runtime.budget import size_texts
from ..runtime.loader import check_batch, default_n_ctx, plan_for
from .common import device_options, kv_options, model_options, parse_ngl, ray_option, resolve_model
from .group import cli

PLAN_SCHEMA_VERSION = 1


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f}"


def _ranges(blocks: list[int]) -> str:
    if not blocks:
        return "-"
    out: list[str] = []
    start: int | None = blocks[0]
    nexts: list[int | None] = [*blocks[1:], None]
    for a, b in zip(blocks, nexts):
        if b != a + 1:
            out.append(f"{start}-{a}" if a != start else f"{a}")
            start = b
    return ",".join(out)


def plan_report(model: str, n_ctx: int, n_batch: int, device: str | None, n_gpu_layers, split,
                ray_address: str | None = None, tensors=None, kv=None, n_parallel: int = 1) -> dict:
    """The ``--json`` document (schema in README "cooktop plan --json").

    ``n_parallel`` sequences (``-np``, the server's slots) share the cache: each device's
    ``kv_bytes`` count every sequence's K/V rows and ``state_bytes`` every sequence's recurrent
    states (f32, llama.cpp's ``llama_memory_recurrent``).

    Raises:
        CooktopError: ``n_parallel`` < 1, or > 1 with ``ray_address`` (a cluster's caches hold one
            sequence per cache here).

    With ``ray_address`` the devices are the cluster's (``NODE/DEVICE``) and the
    document gains ``ray``: ``nodes`` and, per hop of one decoded token,
    ``hops`` (``from``, ``to``, ``node``, ``bytes_per_token``, ``latency_ms``).
    """
    gf = open_gguf(model)
    cfg = load_config(gf)
    n_ctx = default_n_ctx(cfg, n_ctx)
    n_batch = check_batch(n_batch, n_ctx)
    kv = kv or KVConfig()
    if n_parallel < 1:
        raise CooktopError(f"-np must be >= 1, got {n_parallel}")
    if n_parallel > 1 and ray_address:
        raise CooktopError("-np > 1 is not planned with --ray: plan one sequence's cache per cluster placement")
    flash = kv.resolve(cfg.head_dim)  # what run would refuse (llama.cpp's rules) is refused here too
    cluster = None
    if ray_address:
        from ..cluster import connect
        from ..cluster.load import plan_cluster
        from ..cluster.report import transfer_hops

        connect(ray_address)
        cp = plan_cluster(gf, cfg, device, n_gpu_layers, split, n_ctx, n_batch, False)
        p, selectors = cp.placement, cp.selectors
        hops = transfer_hops(cp, cfg)
        cluster = {"nodes": [{"node": n.name, "node_id": n.node_id, "address": n.address} for n in cp.nodes],
                   "hops": hops, "bytes_per_token": sum(h["bytes_per_token"] for h in hops)}
    else:
        selectors = registry.resolve(device)
        p = plan_for(gf, cfg, selectors, n_gpu_layers, split, n_ctx, n_batch, False, tensors, kv, n_parallel)
    rep = {
        "schema": PLAN_SCHEMA_VERSION,
        "model": model,
        "n_layer": cfg.n_layer,
        "n_ctx": n_ctx,
        "n_batch": n_batch,
        "n_parallel": n_parallel,
        "cache_type_k": kv_type_name(kv.type_k),
        "cache_type_v": kv_type_name(kv.type_v),
        "flash_attn": "on" if flash else "off",
        "devices_requested": selectors,
        "n_gpu_layers": p.n_gpu_layers,
        "n_offloaded": p.n_offloaded(),
        "summary": p.summary(),
        "blocks": p.blocks,
        "experts": [p.expert_device(i) for i in range(cfg.n_layer)] if cfg.n_expert else None,
        "head": p.head,
        "devices": [
            {"device": b.selector, "blocks": b.blocks, "head": b.head, "weight_bytes": b.weight_bytes,
             "kv_bytes": b.kv_bytes, "state_bytes": b.state_bytes, "scratch_bytes": b.scratch_bytes,
             "total_bytes": b.total_bytes,
             "memory_bytes": b.memory_bytes, "usable_bytes": b.usable_bytes,
             "max_alloc_bytes": b.max_alloc_bytes, "largest_alloc_bytes": b.largest_alloc_bytes,
             "largest_alloc": b.largest_what, "chunked": b.chunked, "fits": b.fits}
            for b in p.budgets
        ],
        "host_reasons": p.notes,
        "mtp": _mtp_plan(gf, cfg, n_ctx, kv, p.head),
    }
    if cluster is not None:
        rep["ray"] = cluster
    return rep


def _mtp_plan(gf, cfg, n_ctx: int, kv: KVConfig, head: str) -> dict | None:
    """What ``--spec-type draft-mtp`` adds beside the placement (``model/mtp.py``): on the head's device,
    the MTP block's weights and one sequence's (slot's) K/V at ``n_ctx``; None without an MTP block cooktop
    drafts with (``mtp.MTP_ARCHS``: a glm4 one is skipped)."""
    from ..model.mtp import MTP_ARCHS, mtp_weight_bytes
    if not cfg.n_layer_nextn or cfg.arch not in MTP_ARCHS:  # glm4: the MTP block is not run
        return None
    rk, rv = kv.row_bytes(cfg.n_embd_kv)
    return {"device": head, "block": cfg.n_layer, "weight_bytes": mtp_weight_bytes(gf, cfg),
            "kv_bytes_per_sequence": n_ctx * (rk + rv)}


@cli.command("plan")
@model_options
@click.option("-c", "--ctx-size", "n_ctx", default=0, help="Context size in tokens (0 = from the model, <= 4096).")
@click.option("-b", "--batch-size", "n_batch", default=512, show_default=True)
@click.option("-np", "--parallel", "n_parallel", default=1, show_default=True,
              help="Sequences sharing the cache (serve's slots): their K/V and recurrent states are counted.")
@kv_options
@device_options
@ray_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (stable schema, see README).")
def plan_cmd(model, hf_repo, hf_file, n_ctx, n_batch, n_parallel, device, n_gpu_layers, split, ray_address, tensors, kv,
             as_json):
    """Show the placement of a model's layers on devices (per-device memory, fits or not).

    With --ray, layers are placed across the cluster's nodes by each device's probed memory,
    and each hop of a decoded token is listed with its bytes and measured latency.
    """
    path = resolve_model(model, hf_repo, hf_file)
    rep = plan_report(path, n_ctx, n_batch, device, parse_ngl(n_gpu_layers), split, ray_address, tensors, kv,
                      n_parallel)
    if as_json:
        click.echo(json.dumps(rep, indent=2))
        return
    slots = f", -np {rep['n_parallel']}" if rep["n_parallel"] > 1 else ""
    click.echo(f"{rep['model']}: n_layer {rep['n_layer']}, n_ctx {rep['n_ctx']}, n_batch {rep['n_batch']}{slots}, "
               f"-ngl {rep['n_gpu_layers']}, KV cache K {rep['cache_type_k']} V {rep['cache_type_v']}, "
               f"flash attention {rep['flash_attn']}")
    states = any(d["state_bytes"] for d in rep["devices"])  # a column only for models with recurrent blocks
    rows = [[d["device"], _ranges(d["blocks"]), "yes" if d["head"] else "", _mib(d["weight_bytes"]),
             _mib(d["kv_bytes"]), *([_mib(d["state_bytes"])] if states else []), _mib(d["scratch_bytes"]),
             _mib(d["total_bytes"]), _mib(d["usable_bytes"]) if d["device"] != "cpu" else "host",
             "yes" if d["fits"] else "NO"]
            for d in rep["devices"]]
    click.echo(tabulate(rows, headers=["device", "blocks", "output", "weights MiB", "KV MiB",
                                       *(["state MiB"] if states else []), "scratch MiB",
                                       "total MiB", "usable MiB", "fits"]))
    if rep["experts"] and rep["experts"] != rep["blocks"]:
        where: dict[str, list[int]] = {}
        for i, sel in enumerate(rep["experts"]):
            where.setdefault(sel, []).append(i)
        click.echo("experts (feed-forward halves): "
                   + "; ".join(f"{sel} blocks {_ranges(b)}" for sel, b in where.items()))
    click.echo(rep["summary"])
    if rep.get("mtp"):
        m = rep["mtp"]
        click.echo(f"with --spec-type draft-mtp: + {_mib(m['weight_bytes'])} MiB weights (MTP block blk.{m['block']}) "
                   f"and {_mib(m['kv_bytes_per_sequence'])} MiB K/V per sequence on {m['device']}")
    for d in rep["devices"]:
        if d["chunked"]:
            click.echo(f"note: {d['device']}: {', '.join(d['chunked'])} past the maximum allocation "
                       f"{size_texts(d['max_alloc_bytes'])[0]}: stored in row chunks")
    for r in rep["host_reasons"]:
        click.echo(f"note: {r}")
    if "ray" in rep:
        hops = rep["ray"]["hops"]
        click.echo(tabulate([[h["from"], h["to"], h["node"], h["bytes_per_token"],
                              "?" if h["latency_ms"] is None else f"{h['latency_ms']:.2f}"] for h in hops],
                            headers=["hop from", "to", "node", "bytes/token", "latency ms"]))
        total = sum(h["latency_ms"] or 0.0 for h in hops)
        click.echo(f"per decoded token: {rep['ray']['bytes_per_token']} bytes over {len(hops)} hops, "
                   f"~{total:.2f} ms of hop latency (actor-call round trips, median of 20)")
