"""Table files (configs/experiments/*.json) -> the cells and runs of one table at one scale.

A table file names its methods (each a set of `gnmr train --set` overrides), the scales it
runs at (each based on an entry of configs/experiments/scales.json: corpus, model presets,
training settings, seeds) and the reference cells of its report. A cell is one model x one
method; a run is one cell with one seed, in its own run directory
OUT/<table>/<scale>/<model>-<method>/seed-<S>.

Overrides of a run, later ones win:
  table `set` < scale `set` < model `set` < method `set` < --set from the command line
  < seed keys (scales.json `seed_keys`, all = S) < harness keys (train.threads, log.gnmr_trace)

A table may be `like` another: it inherits that table's `set` and scales, and its methods
either share a run with a method of the other table (`same_as`: same overrides, same run
directory) or start from one and add overrides (`extends`).
"""

import copy
import json
import os

STATIC_CONTROLLERS = ("static_low", "static_high")
RECIPES_WITHOUT_LOW_PATH = ("fp32", "bf16")
# Keys the harness sets per run; they may differ between the start and the resume of a run.
HARNESS_KEYS = ("train.threads",)


class SpecError(Exception):
    """A table file or a command-line choice that does not make sense; the message says why."""


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise SpecError(f"{path}: cannot read ({e.strerror})")
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}: invalid JSON ({e})")


def table_names(experiments_dir):
    return sorted(f[:-5] for f in os.listdir(experiments_dir)
                  if f.endswith(".json") and f != "scales.json")


def _resolve_scale(name, entry, base_scales, where):
    base_name = entry.get("base", name)
    if base_name not in base_scales:
        raise SpecError(f"{where}: scale {name!r} is based on {base_name!r}, which "
                        f"scales.json does not define (it has: {', '.join(base_scales)})")
    scale = copy.deepcopy(base_scales[base_name])
    for key, value in entry.items():
        if key == "set":
            scale.setdefault("set", {}).update(value)
        elif key != "base":
            scale[key] = copy.deepcopy(value)
    return scale


def load_table(name, experiments_dir, _seen=()):
    """The resolved table: name, title, reference, low_reference, set, methods, scales,
    seed_keys. methods[m] = {label, set, owner_table, owner_method}."""
    path = os.path.join(experiments_dir, name + ".json")
    if not os.path.exists(path):
        raise SpecError(f"no table {name!r}: {path} does not exist "
                        f"(tables: {', '.join(table_names(experiments_dir))})")
    if name in _seen:
        raise SpecError(f"{path}: `like` chain loops back to {name!r}")
    raw = _read_json(path)
    scales_file = _read_json(os.path.join(experiments_dir, "scales.json"))
    base_scales = scales_file.get("scales", {})
    table = {
        "name": raw.get("table", name),
        "title": raw.get("title", name),
        "reference": raw.get("reference"),
        "low_reference": raw.get("low_reference"),
        "seed_keys": scales_file.get("seed_keys", ["train.seed"]),
        "path": path,
    }
    methods_raw = raw.get("methods")
    if not isinstance(methods_raw, dict) or not methods_raw:
        raise SpecError(f"{path}: `methods` must be a non-empty object")

    if "like" in raw:
        parent = load_table(raw["like"], experiments_dir, _seen + (name,))
        for key in ("set",):
            if key in raw:
                raise SpecError(f"{path}: a table `like` another takes its `{key}` from it; "
                                f"put overrides into the methods (`extends` + `set`)")
        table["set"] = dict(parent["set"])
        scales = {}
        for scale_name, scale in parent["scales"].items():
            scale = copy.deepcopy(scale)
            scale.pop("methods", None)
            scales[scale_name] = scale
        for scale_name, entry in raw.get("scales", {}).items():
            if scale_name not in scales:
                raise SpecError(f"{path}: scale {scale_name!r} is not a scale of {raw['like']!r}")
            if "set" in entry or "base" in entry:
                raise SpecError(f"{path}: scale {scale_name!r}: a table `like` another may only "
                                f"choose `methods`/`seeds` there, not `set` or `base`")
            scales[scale_name].update(copy.deepcopy(entry))
        table["scales"] = scales
        methods = {}
        for m, spec in methods_raw.items():
            if "same_as" in spec and "extends" in spec:
                raise SpecError(f"{path}: method {m!r} has both `same_as` and `extends`")
            if "same_as" in spec:
                other = _parent_method(parent, spec["same_as"], path, m)
                if spec.get("set"):
                    raise SpecError(f"{path}: method {m!r} is `same_as` {spec['same_as']!r} "
                                    f"and so cannot add `set`; use `extends`")
                methods[m] = {"label": spec.get("label", other["label"]), "set": dict(other["set"]),
                              "owner_table": other["owner_table"],
                              "owner_method": other["owner_method"]}
            else:
                merged = {}
                if "extends" in spec:
                    merged.update(_parent_method(parent, spec["extends"], path, m)["set"])
                merged.update(spec.get("set", {}))
                methods[m] = {"label": spec.get("label", m), "set": merged,
                              "owner_table": table["name"], "owner_method": m}
        table["methods"] = methods
    else:
        table["set"] = dict(raw.get("set", {}))
        table["methods"] = {
            m: {"label": spec.get("label", m), "set": dict(spec.get("set", {})),
                "owner_table": table["name"], "owner_method": m}
            for m, spec in methods_raw.items()}
        scales_raw = raw.get("scales")
        if not isinstance(scales_raw, dict) or not scales_raw:
            raise SpecError(f"{path}: `scales` must be a non-empty object")
        table["scales"] = {s: _resolve_scale(s, entry, base_scales, path)
                           for s, entry in scales_raw.items()}
        for m, spec in methods_raw.items():
            if "same_as" in spec or "extends" in spec:
                raise SpecError(f"{path}: method {m!r}: `same_as`/`extends` need a `like` table")

    for scale_name, scale in table["scales"].items():
        unknown = [m for m in scale.get("methods", []) if m not in table["methods"]]
        if unknown:
            raise SpecError(f"{path}: scale {scale_name!r} lists unknown methods {unknown}")
        if not scale.get("models"):
            raise SpecError(f"{path}: scale {scale_name!r} has no models")
    for role in ("reference", "low_reference"):
        if table[role] is not None and table[role] not in table["methods"]:
            raise SpecError(f"{path}: `{role}` {table[role]!r} is not one of the methods")
    return table


def _parent_method(parent, name, path, method):
    if name not in parent["methods"]:
        raise SpecError(f"{path}: method {method!r} refers to {name!r}, which table "
                        f"{parent['name']!r} does not define")
    return parent["methods"][name]


def _substitute(value, corpus_dir):
    if isinstance(value, str):
        return value.replace("{corpus}", corpus_dir)
    return value


def controller_of(overrides):
    return overrides.get("gnmr.controller", "gnmr")


def recipe_of(overrides):
    return overrides.get("precision.recipe", "fp32")


# Steps of a run that measures the recovery gap (the oracle, or log.recovery_gap) cost this
# many ordinary steps: two extra forward + backward passes each (README, "The oracle
# selector"; measured at cpu-small: 4 min a run against 1.3).
GAP_MEASURING_STEP_COST = 3.0


def measures_recovery_gap(overrides):
    return controller_of(overrides) == "oracle" or overrides.get("log.recovery_gap") is True


def is_dynamic(overrides):
    """True when the controller really routes units (worth a gnmr_trace.jsonl)."""
    return (controller_of(overrides) not in STATIC_CONTROLLERS
            and recipe_of(overrides) not in RECIPES_WITHOUT_LOW_PATH)


def parse_only(only, table, scale):
    """--only: cell names (model-method), method names or model names; all of the table's
    methods are allowed, not only the scale's default list."""
    default = scale.get("methods", list(table["methods"]))
    models = list(scale["models"])
    if not only:
        return [(model, m) for model in models for m in default]
    chosen = []
    for item in only:
        matches = [(model, m) for model in models for m in table["methods"]
                   if item in (f"{model}-{m}", m, model)]
        if item in models:  # a model name alone: that model's default methods
            matches = [(item, m) for m in default]
        if not matches:
            raise SpecError(f"--only {item!r}: not a cell, method or model of table "
                            f"{table['name']!r} at this scale (methods: "
                            f"{', '.join(table['methods'])}; models: {', '.join(models)})")
        chosen += [c for c in matches if c not in chosen]
    return chosen


def build_cells(table, scale_name, corpus_dir, extra_set=None, only=None):
    """Cells of the table at one scale: dicts with model, method, label, cell (directory
    name), owner_table, config (model preset path), overrides (ordered dict), corpus_keys
    (the overrides that are paths into the corpus directory: `{corpus}` values)."""
    if scale_name not in table["scales"]:
        raise SpecError(f"table {table['name']!r} has no scale {scale_name!r} "
                        f"(it has: {', '.join(table['scales'])})")
    scale = table["scales"][scale_name]
    cells = []
    for model, method in parse_only(only, table, scale):
        mspec = table["methods"][method]
        model_spec = scale["models"][model]
        overrides, corpus_keys = {}, set()
        for layer in (table["set"], scale.get("set", {}), model_spec.get("set", {}),
                      mspec["set"], extra_set or {}):
            for key, value in layer.items():
                overrides[key] = _substitute(value, corpus_dir)
                if isinstance(value, str) and "{corpus}" in value:
                    corpus_keys.add(key)
                else:
                    corpus_keys.discard(key)
        cells.append({
            "table": table["name"], "scale": scale_name, "model": model, "method": method,
            "label": mspec["label"], "owner_table": mspec["owner_table"],
            "cell": f"{model}-{mspec['owner_method']}", "config": model_spec["config"],
            "overrides": overrides, "corpus_keys": sorted(corpus_keys),
            "dynamic": is_dynamic(overrides),
        })
    return cells


def build_runs(cells, seeds, seed_keys, out_dir, scale_name, threads):
    """One run per cell x seed; runs shared between cells (same_as) appear once."""
    runs, seen = [], set()
    for cell in cells:
        for seed in seeds:
            run_dir = os.path.join(out_dir, cell["owner_table"], scale_name, cell["cell"],
                                   f"seed-{seed}")
            if run_dir in seen:
                continue
            seen.add(run_dir)
            overrides = dict(cell["overrides"])
            for key in seed_keys:
                overrides[key] = seed
            overrides["train.threads"] = threads
            if cell["dynamic"]:
                overrides["log.gnmr_trace"] = True
            runs.append({"cell": cell, "seed": seed, "run_dir": run_dir, "overrides": overrides,
                         "name": os.path.join(cell["owner_table"], scale_name, cell["cell"],
                                              f"seed-{seed}"),
                         "steps": overrides.get("train.steps")})
    return runs
