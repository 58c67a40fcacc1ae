"""The sweep file: its strict schema, every problem reported at once, and every variant's config resolved before
any work (a variant's run folder is named after it, so its name is checked like a run name)."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..config import RUN_NAME, RUN_NAME_RULE, PipelineConfig, load_config, read_yaml
from ..errors import ConfigError
from .pick import parse_pick

# Keys a variant may not override: they name the run folder, the experiment and the registered model
# that the variants share (the champion alias moves between versions of one registered model).
SHARED_KEYS = ("name", "tracking")


# ---------------------------------------------------------------- the sweep file


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Variant(_Strict):
    description: str = ""
    overrides: dict[str, object] = Field(default_factory=dict, description="dotted config key -> value")


class SweepSpec(_Strict):
    description: str = ""
    overrides: dict[str, object] = Field(default_factory=dict, description="applied to every variant")
    pick: str | None = Field(None, description="the default --pick constraint")
    shared_capture: bool = Field(
        False,
        description="variants that differ only in the teacher targets their terms need share one capture holding "
        "all of them (the teacher runs once; a larger cache)",
    )
    variants: dict[str, Variant] = Field(min_length=1)

    @field_validator("variants")
    @classmethod
    def _variant_names(cls, value):
        for name in value:
            if not isinstance(name, str) or not RUN_NAME.fullmatch(name):
                raise ValueError(
                    f"{json.dumps(name)[:80]} is not a usable variant name: it names the variant's run "
                    f"folder. Use {RUN_NAME_RULE}"
                )
        return value


def sweep_problems(exc: ValidationError, path: Path) -> str:
    """Every problem of a sweep file, with its key path; unknown keys get the nearest valid one."""
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        where = ".".join(loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            valid = list((Variant if len(loc) == 3 and loc[0] == "variants" else SweepSpec).model_fields)
            near = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.5)
            lines.append(
                f"  - {where}: unknown key.{f' Did you mean {near[0]!r}?' if near else ''} "
                f"Valid keys here: {', '.join(valid)}."
            )
        else:
            got = err.get("input")
            shown = json.dumps(got, default=str)[:80] if not isinstance(got, dict) else "a mapping"
            lines.append(f"  - {where}: {err['msg'].removeprefix('Value error, ')} (got {shown}).")
    return (
        f"Sweep file {path} has {len(lines)} problem(s):\n" + "\n".join(lines) + "\nA sweep file holds "
        "description, overrides (applied to every variant), pick, and variants: {name: {description, "
        "overrides: {dotted.key: value}}}; see configs/sweeps/depth.yaml."
    )


def override_items(overrides: dict) -> list[str]:
    """A sweep file's {dotted.key: value} as command-line overrides (JSON is YAML)."""
    return [f"{key}={json.dumps(value)}" for key, value in overrides.items()]


@dataclass
class Sweep:
    name: str
    path: Path
    spec: SweepSpec
    configs: dict[str, PipelineConfig]  # variant -> resolved config
    base: PipelineConfig  # the config with the command line's and the sweep's common overrides, no variant's

    @property
    def variants(self) -> list[str]:
        return list(self.spec.variants)


def load_sweep(
    config_name: str, sweep_path: str | Path, overrides: list[str] | None = None, resolve=lambda config: config
) -> Sweep:
    """Read and validate a sweep file and every variant's config, before any work.

    ``resolve`` turns a loaded config into the one that runs (the CLI resolves precision: auto).
    """
    path = Path(sweep_path)
    if not path.is_file():
        found = sorted(str(p) for p in Path("configs/sweeps").glob("*.yaml")) if Path("configs/sweeps").is_dir() else []
        raise ConfigError(
            f"Sweep file {path} not found. Give the path of a sweep YAML file"
            f"{' (found: ' + ', '.join(found) + ')' if found else ''}."
        )
    raw = read_yaml(path)
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(sweep_problems(exc, path)) from None
    for where, items in [
        ("overrides", spec.overrides),
        *((f"variants.{n}.overrides", v.overrides) for n, v in spec.variants.items()),
    ]:
        for key in items:
            if key.split(".")[0] in SHARED_KEYS:
                raise ConfigError(
                    f"Sweep file {path}: {where} sets '{key}', which the variants must share (it names "
                    "the run folder, the MLflow experiment and the registered model whose 'champion' "
                    "alias the pick moves). Remove it from the sweep; set it on the config instead."
                )
    if spec.pick:
        parse_pick(spec.pick)
    common = [*override_items(spec.overrides), *(overrides or [])]  # the command line has the last word
    try:
        base = resolve(load_config(config_name, common))
    except ConfigError as exc:
        raise ConfigError(f"Sweep {path} on config '{config_name}', overrides common to every variant: {exc}") from None
    configs = {}
    for name, variant in spec.variants.items():
        try:
            configs[name] = resolve(
                load_config(
                    config_name,
                    [*override_items(spec.overrides), *override_items(variant.overrides), *(overrides or [])],
                )
            )
        except ConfigError as exc:
            raise ConfigError(f"Sweep {path}, variant '{name}': {exc}") from None
    return Sweep(name=path.stem, path=path, spec=spec, configs=configs, base=base)
