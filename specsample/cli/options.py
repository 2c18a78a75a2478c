"""Options shared by the real-model commands, and the Config they make."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specsample.api.config import ENV_PREFIX, Config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["DEFAULT_BACKEND", "DEFAULT_DRAFT", "DEFAULT_TARGET", "SAMPLING", "add_model_options",
           "config_from_args", "flag", "k_value", "load_config", "refuse_unused", "sampling_given"]

DEFAULT_BACKEND = "torch"
# The CLI's models when no flag, config file or environment names them (a real model); the
# reference backend's toy models are its own defaults.
DEFAULT_TARGET, DEFAULT_DRAFT = "smollm2", "auto"
SAMPLING = ("temperature", "top_k", "top_p", "min_p")  # Config fields set by the sampling flags


def k_value(text: str) -> int | str:
    """--k: an int or 'adaptive'."""
    if text == "adaptive":
        return text
    try:
        return int(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected an int >= 1 or 'adaptive', got {text!r}") from err


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """Backend, models and sampling options shared by the real-model commands.

    Sampling options default to None so that a TOML file (--config) or the
    environment can set them; an explicit option beats both.
    """
    group = parser.add_argument_group("models and sampling")
    group.add_argument("--backend", default=None,
                       help=f"backend name (default: {ENV_PREFIX}BACKEND, the config file, else "
                            f"{DEFAULT_BACKEND!r})")
    group.add_argument("--config", type=Path, default=None, help="a TOML config file")
    group.add_argument("--target", default=None,
                       help=f"target model: {DEFAULT_TARGET!r} (default), a model directory or a "
                            f".gguf file; on the reference backend an 'ngram:...' spec")
    group.add_argument("--draft", default=None,
                       help=f"drafter: {DEFAULT_DRAFT!r} (default on torch: lookup where the context "
                            f"repeats, the shipped head or int8, whichever rates faster here, where "
                            f"Thm 3.8 predicts a speedup, else plain steps), "
                            f"'int8', 'early-exit:N', 'lookup', 'suffix-tree[:N[xD]][+memory]' (a tree "
                            f"of up to N candidates, D deep, from the context and with +memory "
                            f"earlier calls; --k is unused), "
                            f"'head[:FILE]' (a trained draft head), "
                            f"'hybrid[:NAME]', NAME@THRESHOLD or a model spec; on the reference "
                            f"backend 'noisy:E', 'lookup' or 'ngram:...'")
    group.add_argument("--k", type=k_value, default=None,
                       help="drafts per round, or 'adaptive' (default: 8 for auto, which narrows each "
                            "round to the width that pays, so K only caps its longest copies; else 4)")
    group.add_argument("--verifier", choices=("token", "block"), default=None,
                       help="the acceptance rule: 'token' (token-wise, the default) or 'block' "
                            "(block verification); a tree drafter has one rule")
    group.add_argument("--temperature", type=float, default=None, help="0 means greedy")
    group.add_argument("--top-k", type=int, default=None)
    group.add_argument("--top-p", type=float, default=None)
    group.add_argument("--min-p", type=float, default=None)
    group.add_argument("--seed", type=int, default=None)
    group.add_argument("--max-new-tokens", type=int, default=None)
    group.add_argument("--device", default=None, help="backend option 'device' (e.g. cpu, cuda:0)")
    group.add_argument("--dtype", default=None, help="backend option 'dtype' (e.g. float32)")
    group.add_argument("--tp", type=int, default=None,
                       help="backend option 'tp' (torch): shard the target over this many ranks of "
                            "a `torchrun --nproc_per_node TP -m specsample ...` launch")
    group.add_argument("--check-replicas", action="store_true", default=None,
                       help="backend option 'check_replicas' (torch, tp > 1): check after every "
                            "round that all ranks committed the same tokens")


def config_from_args(args: argparse.Namespace, *, environ: Mapping[str, str] | None = None) -> Config:
    """Defaults < environment < --config TOML < explicit options (backend default: torch).

    Target and draft left unnamed are the CLI's real model and int8 self-draft, except on
    the reference backend (its toy models).
    """
    values: dict[str, Any] = {}
    for name in ("backend", "target", "draft", "k", "verifier", *SAMPLING, "seed"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    options = {name: getattr(args, name) for name in ("device", "dtype", "tp", "check_replicas")
               if getattr(args, name, None) is not None}
    if options:
        values["options"] = options
    return load_config(getattr(args, "config", None), values, environ=environ)


def load_config(file: Path | None, values: Mapping[str, Any], *,
                environ: Mapping[str, str] | None = None) -> Config:
    """Defaults < environment < TOML `file` < `values`, with the CLI's default backend (torch)."""
    env = dict(os.environ if environ is None else environ)
    env.setdefault(ENV_PREFIX + "BACKEND", DEFAULT_BACKEND)  # below env and TOML
    config = Config.load(file, environ=env, values=values)
    if config.backend == "reference":
        return config
    # auto needs the core loop (it gates the model per row and round); the static engines
    # keep their own default, a model draft every round.
    default_draft = DEFAULT_DRAFT if config.backend == "torch" else None
    return dataclasses.replace(config, target=config.target or DEFAULT_TARGET,
                               draft=config.draft or default_draft)


def sampling_given(args: argparse.Namespace, *, environ: Mapping[str, str] | None = None) -> list[str]:
    """The sampling fields the user set: by flag, in the --config file or in the environment."""
    env = os.environ if environ is None else environ
    given = {n for n in SAMPLING if getattr(args, n, None) is not None or ENV_PREFIX + n.upper() in env}
    file = getattr(args, "config", None)
    if file is not None and Path(file).is_file():
        with Path(file).open("rb") as handle:
            given |= set(SAMPLING) & set(tomllib.load(handle))
    return [n for n in SAMPLING if n in given]


def flag(dest: str) -> str:
    """The option string of an argparse destination."""
    return "--" + dest.replace("_", "-")


def refuse_unused(args: argparse.Namespace, defaults: Mapping[str, Any], used: set[str], command: str,
                  hints: Mapping[str, str] | None = None) -> None:
    """Raise ValueError naming the first option given (not at its default) that `command` does not use.

    Args:
        args: the parsed options.
        defaults: every option's default (those of the command's parser).
        used: the destinations the command honours.
        command: the command's name, for the message.
        hints: per destination, what to use instead.
    """
    for dest, default in defaults.items():
        if dest in used or dest in ("run", "command", "what", "defaults"):
            continue
        if getattr(args, dest, default) != default:
            hint = (hints or {}).get(dest, "")
            raise ValueError(f"{flag(dest)}: not used by `specsample {command}`, got "
                             f"{getattr(args, dest)!r}" + (f"; {hint}" if hint else ""))
