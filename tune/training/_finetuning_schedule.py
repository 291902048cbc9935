"""Gradual unfreezing: train a few parameters first, then let more join the optimizer phase by phase.

A schedule is a list of phases. Each phase names parameters by pattern (a glob over parameter names, where a
module name selects all its parameters, or ``re:`` followed by a regular expression matched against the whole
name), may set its own learning rate, and says when the next phase starts: ``{after_steps: N}`` optimizer steps
or ``{after_epochs: N}`` epochs after the phase began, or ``{on_plateau: K}`` when ``K`` validation losses in a
row did not improve on the best of the phase. The recipe wiring is five lines::

    schedule = training.FinetuningSchedule(cfg.finetuning_schedule)      # a list of phases, or "auto"
    schedule.setup(model, optimizer, lr_scheduler)                        # after the optimizer/LR scheduler exist
    for line in schedule.step(global_step, epochs_run, val_loss) or []:  # after each step and each validation
        log.info(line)
    state["finetuning_schedule"] = schedule.state_dict()                  # resume: load it before the optimizer

``"auto"`` makes one phase per block of layers, output side first: the output projection and final norm, then
the layers from last to first, then the embeddings (the order of ULMFiT, Howard & Ruder 2018,
https://arxiv.org/abs/1801.06146), each moving on after ``auto_transition``.

Only parameters that are trainable when :meth:`FinetuningSchedule.setup` runs are scheduled, so with LoRA the
patterns select adapters (``layers.3.*`` unfreezes that layer's ``lora_a``/``lora_b``) and frozen base weights stay
frozen. Parameters are matched by name, never by tensor type, so FSDP2-sharded (DTensor) parameters work; the
prefixes that wrappers insert (activation checkpointing, ``torch.compile``) are ignored.
"""

import difflib
import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from tune.utils import get_logger

log = get_logger(name=__name__)

_TRANSITIONS = ("after_steps", "after_epochs", "on_plateau")
_PHASE_KEYS = ("params", "lr", "transition")
# module names that wrappers insert between a module and its child
_WRAPPER_PARTS = ("_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module")
_BLOCK = re.compile(r"^(.*?)\.(\d+)\.")
_DEFAULT_AUTO_TRANSITION = {"after_epochs": 1}


@dataclass(frozen=True)
class Phase:
    """One phase of a :class:`FinetuningSchedule`.

    Args:
        patterns (tuple[str, ...]): parameter-name patterns (glob, or ``re:`` + regex).
        lr (float | None): the learning rate of the phase's param group; ``None`` for the optimizer's.
        transition (tuple[str, int] | None): ``(kind, count)`` ending the phase; ``None`` for the last phase.
    """

    patterns: tuple[str, ...]
    lr: float | None = None
    transition: tuple[str, int] | None = None

    def matches(self, name: str) -> bool:
        """Whether any pattern of the phase selects the parameter ``name``."""
        return any(pattern_matches(p, name) for p in self.patterns)

    def describe_transition(self) -> str:
        """``"after_steps=10"`` (or ``"last phase"``)."""
        return "last phase" if self.transition is None else f"{self.transition[0]}={self.transition[1]}"


def clean_param_name(name: str) -> str:
    """``name`` without the components that wrappers insert (``_checkpoint_wrapped_module``, ``_orig_mod``)."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_PARTS)


def pattern_matches(pattern: str, name: str) -> bool:
    """Whether ``pattern`` selects the parameter ``name``.

    Args:
        pattern (str): ``re:REGEX`` (``re.fullmatch`` on the name), or a glob (``fnmatch``; a glob matching a
            module name selects that module's parameters too: ``output`` matches ``output.weight``).
        name (str): the parameter name.

    Returns:
        bool: True when it matches.
    """
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*")


def auto_finetuning_phases(names: Iterable[str], transition: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """Generates phases from parameter names: output side, then blocks from last to first, then embeddings.

    A block is the part of a name before its first numeric component (``layers.3`` in
    ``layers.3.attn.q_proj.weight``). Outside the blocks, parameters of a top-level module whose name contains
    ``embed`` are embeddings; the rest (``output``, ``norm``, ...) is the output side.

    Args:
        names (Iterable[str]): parameter names, in model order.
        transition (Mapping[str, int] | None): the transition of every phase but the last. Default
            ``{"after_epochs": 1}``.

    Returns:
        list[dict[str, Any]]: phases in the form :class:`FinetuningSchedule` takes (``params``, ``transition``);
        print them to start a hand-written schedule.
    """
    transition = dict(transition or _DEFAULT_AUTO_TRANSITION)
    output_side, embeddings, blocks = [], [], {}
    containers: list[str] = []
    for name in map(clean_param_name, names):
        block = _BLOCK.match(name)
        if block is not None:
            container, index = block.group(1), int(block.group(2))
            if container not in containers:
                containers.append(container)
            blocks.setdefault((container, index), f"{container}.{index}.*")
        elif "embed" in name.split(".")[0]:
            embeddings.append(name)
        else:
            output_side.append(name)
    groups = [output_side] if output_side else []
    # later containers sit nearer the output (e.g. a vision encoder's layers before the decoder's)
    order = {c: i for i, c in enumerate(containers)}
    for key in sorted(blocks, key=lambda k: (order[k[0]], k[1]), reverse=True):
        groups.append([blocks[key]])
    if embeddings:
        groups.append(embeddings)
    phases = [{"params": group, "transition": dict(transition)} for group in groups]
    if phases:
        del phases[-1]["transition"]
    return phases


def _plain(value: Any) -> Any:
    """Mappings and sequences (OmegaConf nodes included) as dicts and lists; strings as they are."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def _parse_transition(value: Any, where: str, errors: list[str]) -> tuple[str, int] | None:
    if not isinstance(value, Mapping) or len(value) != 1:
        errors.append(
            f"{where}: a transition is one of {{after_steps: N}}, {{after_epochs: N}}, {{on_plateau: K}}; got {value!r}"
        )
        return None
    ((kind, count),) = value.items()
    if kind not in _TRANSITIONS:
        close = difflib.get_close_matches(str(kind), _TRANSITIONS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        errors.append(f"{where}: unknown transition {kind!r}{hint}; allowed: {', '.join(_TRANSITIONS)}")
        return None
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        errors.append(f"{where}.{kind}: must be a positive integer, got {count!r}")
        return None
    return kind, count


def _parse_patterns(value: Any, where: str, errors: list[str]) -> tuple[str, ...]:
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) and p for p in patterns):
        errors.append(
            f"{where}: must be a non-empty list of parameter-name patterns (globs or 're:REGEX'), got {value!r}"
        )
        return ()
    for pattern in patterns:
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as err:
                errors.append(f"{where}: {pattern!r} is not a valid regular expression: {err}")
    return tuple(patterns)


def _parse_phases(spec: list[Any]) -> list[Phase]:
    errors: list[str] = []
    phases = []
    if not spec:
        errors.append("finetuning_schedule: needs at least one phase (or the string 'auto')")
    for i, item in enumerate(spec):
        where = f"finetuning_schedule[{i}]"
        if not isinstance(item, dict):
            errors.append(f"{where}: a phase is a mapping with keys {', '.join(_PHASE_KEYS)}; got {item!r}")
            continue
        unknown = sorted(set(item) - set(_PHASE_KEYS))
        if unknown:
            errors.append(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_PHASE_KEYS)}")
        patterns = _parse_patterns(item.get("params"), f"{where}.params", errors)
        lr = item.get("lr")
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr < 0):
            errors.append(f"{where}.lr: must be a non-negative number or null, got {lr!r}")
            lr = None
        transition = None
        if i < len(spec) - 1:
            if "transition" not in item:
                errors.append(f"{where}: every phase but the last needs a transition, e.g. {{after_steps: 100}}")
            else:
                transition = _parse_transition(item["transition"], f"{where}.transition", errors)
        elif item.get("transition") is not None:
            log.warning("%s.transition has no effect: it is the last phase", where)
        phases.append(Phase(patterns, None if lr is None else float(lr), transition))
    if errors:
        raise ValueError("invalid finetuning_schedule:\n  " + "\n  ".join(errors))
    return phases


class FinetuningSchedule:
    """Gradual unfreezing: phases of parameters that join the optimizer one after the other.

    Args:
        phases (Sequence[Mapping] | str): the ``finetuning_schedule:`` value: a list of phases, each a mapping
            with ``params`` (patterns), optional ``lr`` and ``transition`` (required on all but the last), or
            ``"auto"`` (see :func:`auto_finetuning_phases`).
        auto_transition (Mapping[str, int] | None): the transition of the generated phases for ``"auto"``.
            Default ``{"after_epochs": 1}``.

    Raises:
        ValueError: listing every problem of the phases at once (unknown keys or transitions, a missing
            transition, an invalid regex, a bad learning rate).
    """

    def __init__(self, phases: Sequence[Mapping[str, Any]] | str, auto_transition: Mapping[str, int] | None = None):
        spec = _plain(phases)
        self._auto = isinstance(spec, str)
        if self._auto and spec != "auto":
            raise ValueError(f"finetuning_schedule must be a list of phases or the string 'auto', got {spec!r}")
        if auto_transition is not None:
            errors: list[str] = []
            _parse_transition(_plain(auto_transition), "auto_transition", errors)
            if errors:
                raise ValueError(errors[0])
        self._auto_transition = _plain(auto_transition) or dict(_DEFAULT_AUTO_TRANSITION)
        self._phases: list[Phase] | None = None if self._auto else _parse_phases(spec)
        self._phase_params: list[list[str]] = []
        self._params: dict[str, nn.Parameter] = {}
        self._optimizer: torch.optim.Optimizer | None = None
        self._lr_scheduler: Any = None
        self._base_lr: float | None = None
        self._pending_state: dict[str, Any] | None = None
        self._reset_progress(phase=0, step=0, epoch=0)

    def _reset_progress(self, phase: int, step: int, epoch: int) -> None:
        self._phase, self._start_step, self._start_epoch = phase, step, epoch
        self._best_val_loss: float | None = None
        self._num_bad_evaluations = 0

    @property
    def phases(self) -> list[Phase]:
        """The phases (for ``"auto"``, generated by :meth:`setup`).

        Raises:
            RuntimeError: for an ``"auto"`` schedule before :meth:`setup`.
        """
        if self._phases is None:
            raise RuntimeError("an 'auto' finetuning schedule has phases only after setup(model, optimizer)")
        return self._phases

    @property
    def current_phase(self) -> int:
        """The index of the running phase (0 first)."""
        return self._phase

    def phases_for(self, names: Iterable[str]) -> list[Phase]:
        """The phases this schedule has for a model with these parameter names (generated for ``"auto"``)."""
        if not self._auto:
            return self.phases
        return _parse_phases(auto_finetuning_phases(names, self._auto_transition))

    def validate(self, model: nn.Module | Iterable[str]) -> None:
        """Checks that every pattern matches at least one parameter.

        Args:
            model (nn.Module | Iterable[str]): the model, or just its parameter names (e.g. from a model built
                on the meta device, so nothing is allocated).

        Raises:
            ValueError: naming every pattern that matches no parameter, with the closest parameter names.
        """
        names = _names(model)
        errors = []
        for i, phase in enumerate(self.phases_for(names)):
            for pattern in phase.patterns:
                if not any(pattern_matches(pattern, name) for name in names):
                    errors.append(
                        f"finetuning_schedule[{i}].params: {pattern!r} matches no parameter{_close(pattern, names)}"
                    )
        if errors:
            raise ValueError(
                "invalid finetuning_schedule:\n  " + "\n  ".join(errors) + "\n  (patterns are globs over parameter "
                "names such as 'layers.3.*' or 'output', or 're:' followed by a regular expression)"
            )

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, lr_scheduler: Any = None) -> list[str]:
        """Freezes every trainable parameter outside phase 0 and removes it from ``optimizer``.

        Call it once the optimizer (and LR scheduler, if any) exist and before the first step. When resume state
        was given to :meth:`load_state_dict` before, the saved phase is restored here.

        Args:
            model (nn.Module): the model (possibly FSDP2-sharded, wrapped for activation checkpointing).
            optimizer (torch.optim.Optimizer): its optimizer, not stepped yet.
            lr_scheduler (Any): an LR scheduler over ``optimizer`` (e.g. ``LambdaLR``); new param groups follow
                its multiplier. Default None.

        Returns:
            list[str]: log lines describing the phases.

        Raises:
            ValueError: when a pattern matches no parameter, a phase matches only frozen parameters, or the
                optimizer was already stepped.
            TypeError: when the optimizer cannot take new param groups (optimizer in backward).
        """
        if not callable(getattr(optimizer, "add_param_group", None)):
            raise TypeError(
                f"a finetuning schedule adds param groups to the optimizer, which a {type(optimizer).__name__} cannot "
                "take; use a torch.optim optimizer (optimizer_in_bwd: False) with finetuning_schedule."
            )
        if any(optimizer.state.values()):
            raise ValueError(
                "FinetuningSchedule.setup() must run before the optimizer's first step or state load; "
                "load the schedule's state first (load_state_dict), then the optimizer's."
            )
        self._params = {clean_param_name(n): p for n, p in model.named_parameters()}
        trainable = [n for n, p in self._params.items() if p.requires_grad]
        if not self._auto:
            self.validate(list(self._params))
        self._phases, self._phase_params = self._assign(trainable)
        self._optimizer, self._lr_scheduler = optimizer, lr_scheduler
        self._base_lr = optimizer.defaults.get("lr")
        first = {id(self._params[n]) for n in self._phase_params[0]}
        for name in trainable:
            self._params[name].requires_grad_(id(self._params[name]) in first)
        for index, group in enumerate(optimizer.param_groups):
            group["params"] = [p for p in group["params"] if id(p) in first]
            if self._phases[0].lr is not None:
                self._set_group_lr(group, self._phases[0].lr, index)
        lines = self._describe(trainable)
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            lines += self._restore(state)
        return lines

    def _assign(self, trainable: list[str]) -> tuple[list[Phase], list[list[str]]]:
        phases = self.phases_for(trainable) if self._auto else self.phases
        taken: set[str] = set()
        assigned = []
        for phase in phases:
            names = [n for n in trainable if n not in taken and phase.matches(n)]
            taken.update(names)
            assigned.append(names)
        if self._auto:
            kept = [(p, a) for p, a in zip(phases, assigned) if a]
            phases = [p for p, _ in kept]
            if phases:  # the new last phase ends nothing
                phases[-1] = Phase(phases[-1].patterns, phases[-1].lr, None)
            return phases, [a for _, a in kept]
        empty = [i for i, names in enumerate(assigned) if not names]
        if empty:
            raise ValueError(
                "finetuning_schedule: phase(s) " + ", ".join(map(str, empty)) + " select no trainable parameter: "
                "their patterns match only frozen parameters (e.g. LoRA base weights) or parameters an earlier "
                "phase already took. Point them at trainable ones (for LoRA, the adapters: 'layers.3.*lora*')."
            )
        return phases, assigned

    def _describe(self, trainable: list[str]) -> list[str]:
        assert self._phases is not None
        lines = [f"finetuning schedule: {len(self._phases)} phases"]
        for i, (phase, names) in enumerate(zip(self._phases, self._phase_params)):
            numel = sum(self._params[n].numel() for n in names)
            lines.append(
                f"  phase {i}: {_count(len(names), 'tensor')} ({numel:,} values) {', '.join(phase.patterns)}; "
                f"lr {phase.lr if phase.lr is not None else self._base_lr}; {phase.describe_transition()}"
            )
        unscheduled = len(trainable) - sum(len(names) for names in self._phase_params)
        if unscheduled:
            lines.append(f"  {unscheduled} trainable parameter tensors match no phase and stay frozen")
        return lines

    def _set_group_lr(self, group: dict[str, Any], lr: float, index: int) -> None:
        """Sets a group's base lr, keeping the LR scheduler's current multiplier."""
        factor = self._lr_factor()
        group["lr"] = lr * factor
        if self._lr_scheduler is not None:
            group["initial_lr"] = lr
            base_lrs = getattr(self._lr_scheduler, "base_lrs", None)
            if base_lrs is not None:
                if index < len(base_lrs):
                    base_lrs[index] = lr
                else:
                    base_lrs.append(lr)
            lr_lambdas = getattr(self._lr_scheduler, "lr_lambdas", None)
            if lr_lambdas is not None and index >= len(lr_lambdas):
                lr_lambdas.append(lr_lambdas[0])  # LambdaLR: the new group follows group 0's schedule

    def _lr_factor(self) -> float:
        base_lrs = getattr(self._lr_scheduler, "base_lrs", None)
        if not base_lrs or not base_lrs[0] or self._optimizer is None:
            return 1.0
        return self._optimizer.param_groups[0]["lr"] / base_lrs[0]

    def _transition_due(self, step: int, epoch: int, val_loss: float | None) -> bool:
        assert self._phases is not None
        transition = self._phases[self._phase].transition
        if transition is None:
            return False
        kind, count = transition
        if kind == "after_steps":
            return step - self._start_step >= count
        if kind == "after_epochs":
            return epoch - self._start_epoch >= count
        if val_loss is None:
            return False
        val_loss = float(val_loss)
        if self._best_val_loss is None or val_loss < self._best_val_loss:
            self._best_val_loss, self._num_bad_evaluations = val_loss, 0
        else:
            self._num_bad_evaluations += 1
        return self._num_bad_evaluations >= count

    def step(self, step: int, epoch: int, val_loss: float | torch.Tensor | None = None) -> list[str] | None:
        """Advances to the next phase when the current one's transition is reached.

        Call it after every optimizer step and after every validation (with ``val_loss``).

        Args:
            step (int): optimizer steps taken so far in the run.
            epoch (int): epochs completed so far.
            val_loss (float | torch.Tensor | None): the validation loss just computed, if any (``on_plateau``).

        Returns:
            list[str] | None: log lines when a new phase began, else ``None``.

        Raises:
            RuntimeError: when called before :meth:`setup`.
        """
        if self._optimizer is None:
            raise RuntimeError("FinetuningSchedule.step() called before setup(model, optimizer)")
        assert self._phases is not None
        if not self._transition_due(step, epoch, val_loss):
            return None
        reason = self._phases[self._phase].describe_transition()
        return [
            f"finetuning schedule: phase {self._phase} -> {self._phase + 1} at step {step} (epoch {epoch}, "
            f"{reason} reached): {self._advance(step, epoch)}"
        ]

    def _advance(self, step: int, epoch: int) -> str:
        assert self._phases is not None and self._optimizer is not None
        self._reset_progress(self._phase + 1, step, epoch)
        phase, names = self._phases[self._phase], self._phase_params[self._phase]
        params = [self._params[n] for n in names]
        for param in params:
            param.requires_grad_(True)
        lr = phase.lr if phase.lr is not None else self._base_lr
        group = {"params": params}
        self._optimizer.add_param_group(group)
        index = len(self._optimizer.param_groups) - 1
        if lr is not None:
            self._set_group_lr(self._optimizer.param_groups[index], lr, index)
        numel = sum(p.numel() for p in params)
        current = self._optimizer.param_groups[index]["lr"]
        if lr is None or current == lr:
            lr_text = f"lr {current:g}"
        else:
            lr_text = f"lr {lr:g}, {current:.3g} at this point of the LR schedule"
        return (
            f"{_count(len(params), 'tensor')} ({numel:,} values) matching {', '.join(phase.patterns)} join the "
            f"optimizer as param group {index} ({lr_text})"
        )

    def state_dict(self) -> dict[str, Any]:
        """The resume state: the phase, when it began, and its plateau tracking (plain Python values).

        Returns:
            dict[str, Any]: the state.
        """
        return {
            "phase": self._phase,
            "phase_start_step": self._start_step,
            "phase_start_epoch": self._start_epoch,
            "best_val_loss": self._best_val_loss,
            "num_bad_evaluations": self._num_bad_evaluations,
            "phase_sizes": [len(names) for names in self._phase_params] if self._phase_params else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> list[str]:
        """Restores the phase of a saved run, re-creating its param groups in the original order.

        Call it after :meth:`setup` (or before: it is then applied by ``setup``) and before loading the
        optimizer's state, so the optimizer has the param groups the saved state refers to.

        Args:
            state (Mapping[str, Any]): what :meth:`state_dict` returned.

        Returns:
            list[str]: log lines (empty when applied later by ``setup``).

        Raises:
            ValueError: when the state comes from a schedule with other phases, or the optimizer was stepped
                since ``setup``.
        """
        if self._optimizer is None:
            self._pending_state = dict(state)
            return []
        return self._restore(state)

    def _restore(self, state: Mapping[str, Any]) -> list[str]:
        sizes = [len(names) for names in self._phase_params]
        if state.get("phase_sizes") is not None and list(state["phase_sizes"]) != sizes:
            raise ValueError(
                f"the saved finetuning schedule had phases of {state['phase_sizes']} parameter tensors, this one has "
                f"{sizes}: resume with the finetuning_schedule (and model) of the saved run."
            )
        if self._phase != 0:
            raise ValueError("FinetuningSchedule.load_state_dict() needs a freshly set up schedule (phase 0).")
        target = int(state["phase"])
        for _ in range(target):
            self._advance(int(state["phase_start_step"]), int(state["phase_start_epoch"]))
        self._reset_progress(target, int(state["phase_start_step"]), int(state["phase_start_epoch"]))
        self._best_val_loss = state.get("best_val_loss")
        self._num_bad_evaluations = int(state.get("num_bad_evaluations", 0))
        return [
            f"finetuning schedule: resumed in phase {target} of {len(sizes)} (began at step "
            f"{self._start_step}, epoch {self._start_epoch})"
        ]


def _count(num: int, noun: str) -> str:
    return f"{num} {noun}{'' if num == 1 else 's'}"


def _names(model: nn.Module | Iterable[str]) -> list[str]:
    if isinstance(model, nn.Module):
        return [clean_param_name(n) for n, _ in model.named_parameters()]
    names = list(model)
    if not all(isinstance(n, str) for n in names):
        raise TypeError("validate() takes an nn.Module or an iterable of parameter names (str)")
    return [clean_param_name(n) for n in names]


def _close(pattern: str, names: list[str]) -> str:
    modules = sorted({".".join(n.split(".")[:k]) for n in names for k in range(1, n.count(".") + 2)})
    close = difflib.get_close_matches(pattern.removeprefix("re:").rstrip(".*"), modules, n=3)
    return f"; close names: {', '.join(close)}" if close else ""
