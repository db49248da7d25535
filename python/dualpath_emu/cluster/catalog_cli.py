"""``dualpath-emu catalog [FILE]``: the models, GPUs and NICs a scenario can name, with the numbers the
emulator derives from them (KV bytes, parameters) and where each entry comes from."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from dualpath_emu.cluster.catalog import KIND, PACKAGED, PACKAGED_FILE, Catalog, ModelSpec
from dualpath_emu.config import load_toml

__all__ = ["catalog_command", "catalog_json", "load_any_catalog"]


def load_any_catalog(path: str | Path) -> Catalog:
    """The catalog a file makes: its entries (or a cluster scenario's), with the packaged ones."""
    from dualpath_emu.cluster.scenario import scenario_catalog
    from dualpath_emu.scenarios import find

    found = find(path)
    top = load_toml(found)
    if top.get_str("kind", "") == KIND:
        return PACKAGED.with_file(found)
    return scenario_catalog(top, found.parent)


def catalog_json(catalog: Catalog) -> dict[str, Any]:
    """Every entry as data: its fields, derived numbers and the file that defines it."""

    def entry(kind: str, name: str, spec: Any) -> dict[str, Any]:
        out = dataclasses.asdict(spec)
        out["defined_in"] = catalog.origin.get(f"{kind}.{name}", "")
        if isinstance(spec, ModelSpec):
            out["kv_bytes_per_token"] = spec.kv_bytes_per_token
        return out

    kinds: dict[str, Mapping[str, Any]] = {"models": catalog.models, "gpus": catalog.gpus, "nics": catalog.nics}
    return {kind: {n: entry(kind, n, s) for n, s in entries.items()} for kind, entries in kinds.items()}


def catalog_command(args: argparse.Namespace) -> int:
    """Runs ``dualpath-emu catalog``."""
    catalog = PACKAGED if args.file is None else load_any_catalog(args.file)
    if args.json:
        print(json.dumps(catalog_json(catalog), indent=2))
        return 0
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 100))
    for table in (_models(catalog), _gpus(catalog), _nics(catalog)):
        console.print(table)
        console.print()
    console.print("Sources:")
    for kind, entries in (("models", catalog.models), ("gpus", catalog.gpus), ("nics", catalog.nics)):
        for name, spec in entries.items():
            where = catalog.origin.get(f"{kind}.{name}", "")
            mine = "" if where == str(PACKAGED_FILE) else f" [defined in {where}]"
            console.print(f"  {name}: {spec.description}. {spec.source or '(no source given)'}{mine}",
                          highlight=False, markup=False)  # fmt: skip
    return 0


def _table(title: str, headers: tuple[str, ...], left: int) -> Table:
    """A table whose first ``left`` columns are text (left-aligned), the rest numbers."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False)
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i < left else "right", no_wrap=True)
    return table


def _attention(spec: ModelSpec) -> str:
    arch = spec.arch
    if arch is None:
        return spec.attention
    if spec.attention == "mla":
        text = f"MLA r{arch.kv_lora_rank}"
    else:
        text = f"{spec.attention.upper()} {arch.num_attention_heads}/{arch.kv_heads}"
    return text + (f" top-{spec.sparse_top_k}" if spec.sparse_top_k else "")


def _models(catalog: Catalog) -> Table:
    table = _table(
        "Models", ("name", "attention", "layers", "hidden", "KV B/tok/l", "params B", "experts", "dtype"), left=2
    )
    for name, spec in catalog.models.items():
        arch = spec.arch
        experts = "-"
        if arch is not None and arch.n_routed_experts:
            experts = f"{arch.n_routed_experts}/{arch.num_experts_per_tok}" + (
                f"+{arch.n_shared_experts}" if arch.n_shared_experts else ""
            )
        layers = f"{spec.layers}" + (f"/{spec.moe_layers}" if spec.moe_layers else "")
        dtype = spec.gemm_dtype if arch is None else f"{arch.weight_dtype}/{arch.kv_dtype}"
        table.add_row(
            name, _attention(spec), layers, f"{spec.hidden:,}", f"{spec.kv_bytes_per_token_layer:,}",
            f"{spec.active_params / 1e9:.1f}/{spec.total_params / 1e9:.1f}", experts, dtype,
        )  # fmt: skip
    table.caption = ("attention: MLA latent rank or query/KV heads, sparse top-k; layers: all/MoE; params: "
                     "active/total; experts: routed/per token+shared; dtype: weights/KV")  # fmt: skip
    table.caption_justify = "left"
    return table


def _gpus(catalog: Catalog) -> Table:
    table = _table("GPUs", ("name", "BF16 TFLOP/s", "FP8", "FP4", "HBM GiB", "HBM TB/s", "NVLink GB/s"), left=1)
    for name, g in catalog.gpus.items():
        fp4 = f"{g.fp4_flops_per_s / 1e12:,.0f}" if g.fp4_flops_per_s else "-"
        fp8 = f"{g.fp8_flops_per_s / 1e12:,.0f}" if g.fp8_flops_per_s else "-"
        table.add_row(name, f"{g.bf16_flops_per_s / 1e12:,.0f}", fp8, fp4, f"{g.hbm_bytes / (1 << 30):g}",
                      f"{g.hbm_bytes_per_s / 1e12:g}", f"{g.nvlink_bytes_per_s / 1e9:g}")  # fmt: skip
    return table


def _nics(catalog: Catalog) -> Table:
    table = _table("NICs", ("name", "description", "Gb/s", "GB/s"), left=2)
    for name, nic in catalog.nics.items():
        table.add_row(
            name, nic.description.split(":")[0], f"{nic.bytes_per_s * 8 / 1e9:g}", f"{nic.bytes_per_s / 1e9:g}"
        )
    return table
