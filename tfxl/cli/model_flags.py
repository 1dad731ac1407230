"""The model flags of every tool that builds a model from flags (tfxl-train, tfxl-convert), and
the evaluation-setting flags (tfxl-eval, tfxl-export, tfxl-generate).

A model is described the same way by every tool:
  1. --preset's fields,
  2. the tool's own defaults (tfxl-convert: the TF1 LayerNorm epsilon),
  3. the fields in the --config JSON file (a whole TransfoXLConfig, e.g. a model_dir's
     config.json, or only some fields),
  4. the tool's own sources (tfxl-convert: the --hf_config translation),
  5. the override flags, one per TransfoXLConfig field (--n_layer, --cutoffs, ...), generated
     from the fields: type from the annotation, help and range rule from the field's metadata,
  6. what the tool sets itself (tfxl-train: vocab_size from the data; it has no flag there),
later ones winning. --config is layered on --preset, not instead of it: every flag a user
gives counts, the same way for every tool.
"""

import dataclasses
import sys
import typing

from absl import flags

from tfxl.config import EVAL_SETTINGS, PRESETS, TransfoXLConfig, field_rules, scalar_type


def config_fields(exclude=()):
    """[(name, kind, help)] for the TransfoXLConfig fields that get a flag: kind is int, float,
    bool, str (a name, one of the field's `choices`), "ints" or "bools" (comma-separated lists),
    read from the field's type annotation."""
    hints = typing.get_type_hints(TransfoXLConfig)
    fields = []
    for field in dataclasses.fields(TransfoXLConfig):
        if field.name in exclude:
            continue
        kind = str if hints[field.name] is str else scalar_type(hints[field.name])
        if kind is None:  # tuple[int, ...] or Optional[tuple[bool, ...]]
            element = str(hints[field.name])
            kind = "bools" if "bool" in element else "ints"
        fields.append((field.name, kind, field.metadata["help"]))
    return fields


def model_flag_names(exclude=()):
    """The names of the flags define_config_flags defines, in their order."""
    return ["preset", "config", *(name for name, _, _ in config_fields(exclude))]


def define_config_flags(preset_default=None, exclude=(), config_help="", flag_values=None):
    """Defines --preset, --config and one override flag per TransfoXLConfig field (except
    `exclude`: the fields the tool sets itself), registered as the calling module's flags. Each
    numeric flag is checked at parsing by its field's range rule (the rule config.json obeys)."""
    fv = flags.FLAGS if flag_values is None else flag_values
    where = dict(module_name=sys._getframe(1).f_globals["__name__"], flag_values=fv)
    flags.DEFINE_enum("preset", preset_default, sorted(PRESETS),
                      "Base model hyper-parameters: one of the paper's settings (tfxl.PRESETS).",
                      **where)
    flags.DEFINE_string("config", None, "JSON file of TransfoXLConfig fields (all or some, e.g. "
                        "a model_dir's config.json), layered on --preset." + config_help,
                        **where)
    rules = field_rules()
    choices = {f.name: f.metadata["choices"] for f in dataclasses.fields(TransfoXLConfig)}
    for name, kind, help_ in config_fields(exclude):
        help_ = f"Model: {help_} (default: --preset/--config's)"
        if kind is int:
            flags.DEFINE_integer(name, None, help_, **where)
        elif kind is float:
            flags.DEFINE_float(name, None, help_, **where)
        elif kind is bool:
            flags.DEFINE_bool(name, None, help_, **where)
        elif kind is str:
            flags.DEFINE_enum(name, None, list(choices[name]), help_, **where)
        else:
            flags.DEFINE_list(name, None, help_ + " Comma-separated "
                              f"{'integers' if kind == 'ints' else 'true/false'}.", **where)
        if name in rules:
            holds, rule = rules[name]
            flags.register_validator(name, lambda v, holds=holds: v is None or holds(v, None),
                                     f"out of range: it must be {rule}", flag_values=fv)


def _list_value(name, kind, values):
    items = [v.strip() for v in values if v.strip()]
    if kind == "ints":
        try:
            return tuple(int(v) for v in items)
        except ValueError:
            raise ValueError(f"--{name}: not integers: {','.join(values)}") from None
    truth = {"1": True, "true": True, "t": True, "yes": True, "y": True,
             "0": False, "false": False, "f": False, "no": False, "n": False}
    bad = [v for v in items if v.lower() not in truth]
    if bad:
        raise ValueError(f"--{name}: {bad[0]!r} is not true/false")
    return tuple(truth[v.lower()] for v in items)


def resolve_config(flag_values=None, defaults=None, sources=(), fixed=None):
    """The TransfoXLConfig the flags of `define_config_flags` describe (the rule above).

    defaults: {field: value}, the tool's own defaults (over --preset, under everything else).
    sources: [(what, {field: value})], the tool's own sources between --config and the flags.
    fixed: {field: value} the tool sets itself, over everything.
    A tie_projs not given by --config or --tie_projs is dropped when it does not fit the cutoffs
    (a preset's was written for the preset's cutoffs). Raises ValueError naming the sources.
    """
    from tfxl.files import read_json  # loads TensorFlow: the tool has by now
    fv = flags.FLAGS if flag_values is None else flag_values
    known = {f.name for f in dataclasses.fields(TransfoXLConfig)}
    fields, layers = {}, []
    if fv.preset:
        fields.update(PRESETS[fv.preset])
        layers.append(f"--preset={fv.preset}")
    fields.update(defaults or {})
    pinned = set()  # fields given by --config or a flag
    if fv.config:
        data = read_json(fv.config, "--config")
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"--config {fv.config}: unknown TransfoXLConfig field(s) {unknown}")
        fields.update(data)
        pinned |= set(data)
        layers.append(f"--config={fv.config}")
    for what, values in sources:
        fields.update(values)
        layers.append(what)
    given = []
    for name, kind, _ in config_fields():
        if name in fv and fv[name].value is not None:
            value = fv[name].value
            fields[name] = _list_value(name, kind, value) if kind in ("ints", "bools") else value
            pinned.add(name)
            given.append(f"--{name}")
    if given:
        layers.append(" ".join(given))
    fields.update(fixed or {})
    if ("tie_projs" not in pinned and fields.get("tie_projs") is not None
            and len(fields["tie_projs"]) != len(tuple(fields.get("cutoffs", ()))) + 1):
        fields["tie_projs"] = None
    try:
        return TransfoXLConfig.from_dict(fields)
    except ValueError as err:
        raise ValueError(f"{err} (model from "
                         f"{', '.join(layers) or 'the TransfoXLConfig defaults'})") from None


def check_transformer_xl(config, tool):
    """ValueError where `config` is a baseline's (--architecture other than transformer_xl):
    `tool` (tfxl-convert, tfxl-classify-train) builds Transformer-XL models only."""
    if config.architecture != "transformer_xl":
        raise ValueError(f"--architecture={config.architecture}: {tool} builds Transformer-XL "
                         "models only (the baselines train with tfxl-train)")


def define_eval_flags(names=EVAL_SETTINGS, note="", flag_values=None):
    """Flags overriding the evaluation settings (TransfoXLConfig.eval_settings resolves them),
    registered as the calling module's flags."""
    module = sys._getframe(1).f_globals["__name__"]
    where = dict(module_name=module, flag_values=flags.FLAGS if flag_values is None
                 else flag_values)
    what = {"tgt_len": "Segment length T", "mem_len": "Memory length M",
            "clamp_len": "Clamp relative distances at this (-1: no clamp)",
            "same_length": "Every query attends to the same number of keys"}
    for name in names:
        help_ = f"{what[name]} (default: the config's eval_{name}, else its {name}){note}."
        define = flags.DEFINE_bool if name == "same_length" else flags.DEFINE_integer
        define(name, None, help_, **where)


def eval_overrides(names=EVAL_SETTINGS, flag_values=None):
    """{setting: flag value} for TransfoXLConfig.eval_settings (None: the config's)."""
    fv = flags.FLAGS if flag_values is None else flag_values
    return {name: fv[name].value for name in names if name in fv}
