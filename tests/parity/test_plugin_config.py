"""What ``llmsched.vllm`` reads of vLLM's config: every field classified (an upgrade is a
checklist), a field it needs and does not find an error naming it, and the one llmsched <->
vLLM mapping the same both ways. Runs where vLLM is importable (``make parity-test``)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33.0 is installed in its own venv: make parity-test")

import vllm.config
from tests.parity.references import BLOCK, reference

import llmsched.vllm as plugin
from llmsched.bench import vllm_reference as ref
from llmsched.vllm._config import SHARED_FIELDS, read
from llmsched.vllm._fields import CHECKED, FIELDS, PROPERTIES_READ, READ

# Where each classified class lives in this vLLM.
_CLASSES = {
    **{name: getattr(vllm.config, name) for name in FIELDS if hasattr(vllm.config, name)},
    "AuxOutputConfig": __import__(
        "vllm.config.aux_output", fromlist=["AuxOutputConfig"]
    ).AuxOutputConfig,
}


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("class_name", sorted(FIELDS))
def test_every_field_of_vllms_config_classes_is_classified(class_name: str) -> None:
    """A field vLLM adds is read, checked, or not read for a reason written down; a field
    the plug-in reads or checks exists in this vLLM (else it was renamed)."""
    fields = _field_names(_CLASSES[class_name])
    table = FIELDS[class_name]
    unclassified = sorted(fields - set(table))
    assert not unclassified, (
        f"vLLM {vllm.__version__}'s {class_name} has fields llmsched.vllm._fields does not "
        f"classify (does vLLM's scheduler act on them?): {unclassified}"
    )
    needed = {name for name, use in table.items() if use in (READ, CHECKED)}
    assert needed <= fields, f"{class_name} lacks {sorted(needed - fields)}"
    for name, use in table.items():
        assert use.strip(), f"{class_name}.{name}: no reason given"


def test_the_derived_values_the_plugin_reads_exist() -> None:
    """The values vLLM derives that the plug-in reads (properties, and attributes set at
    construction) are there, on a configured engine's objects."""
    config = reference(num_speculative_tokens=2).vllm_config
    objects = {type(obj).__name__: obj for obj in (config, config.model_config)}
    objects["SpeculativeConfig"] = config.speculative_config
    objects["AuxOutputConfig"] = config.aux_output_config
    for class_name, names in PROPERTIES_READ.items():
        for name in names:
            assert hasattr(objects[class_name], name), f"{class_name}.{name} is gone"


class _Watched:
    """A config object whose attribute reads are logged as ``(class name, attribute)``; a
    classified config object it hands out is watched too. ``hidden`` attributes are missing
    (AttributeError), as in a vLLM without them."""

    def __init__(self, target: Any, log: set[tuple[str, str]], hidden: tuple[str, str]) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_hidden", hidden)

    def __getattr__(self, name: str) -> Any:
        target = object.__getattribute__(self, "_target")
        log = object.__getattribute__(self, "_log")
        hidden = object.__getattribute__(self, "_hidden")
        class_name = type(target).__name__
        if (class_name, name) == hidden:
            raise AttributeError(name)
        value = getattr(target, name)
        log.add((class_name, name))
        if type(value).__name__ in FIELDS:
            return _Watched(value, log, hidden)
        return value


def _configs() -> list[Any]:
    """References covering every branch the plug-in reads config in: drafts, KV events
    configured but off, async scheduling, prefix caching off, LoRA."""
    with_events = reference(num_speculative_tokens=2)
    _set(with_events.vllm_config, "kv_events_config", vllm.config.KVEventsConfig())
    return [
        with_events,
        reference(async_scheduling=True, enable_prefix_caching=False),
        reference(max_loras=2),
    ]


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


def _build(reference: Any, log: set[tuple[str, str]], hidden: tuple[str, str] = ("", "")) -> Any:
    return plugin.Scheduler(
        vllm_config=_Watched(reference.vllm_config, log, hidden),
        kv_cache_config=reference.kv_cache_config,
        structured_output_manager=reference.structured_output_manager,
        block_size=reference.block_size,
        hash_block_size=reference.block_size,
    )


def _reads() -> set[tuple[str, str]]:
    log: set[tuple[str, str]] = set()
    for config in _configs():
        _build(config, log)
    return log


def test_the_plugin_reads_only_what_the_table_says_it_reads() -> None:
    """Every config attribute the plug-in reads is a field classified read or checked (or a
    property vLLM derives, listed), and every field classified so is read."""
    reads = _reads()
    for class_name, name in sorted(reads):
        use = FIELDS[class_name].get(name)
        listed = name in PROPERTIES_READ.get(class_name, ())
        assert use in (READ, CHECKED) or listed, (
            f"llmsched.vllm reads {class_name}.{name}, classified {use!r}"
        )
    claimed = {
        (class_name, name)
        for class_name, table in FIELDS.items()
        for name, use in table.items()
        if use in (READ, CHECKED)
    }
    assert claimed <= reads, f"classified read or checked, never read: {sorted(claimed - reads)}"


def test_a_field_the_plugin_reads_and_this_vllm_lacks_is_an_error_naming_it() -> None:
    """Every config attribute the plug-in reads, taken away: construction fails with
    ``UnsupportedVersionError`` naming it, never falling back to a default."""
    reads = _reads()
    assert len(reads) > 30
    for hidden in sorted(reads):
        with pytest.raises(plugin.UnsupportedVersionError) as raised:
            for config in _configs():
                _build(config, set(), hidden)
        assert re.search(rf"reads vLLM's ([\w.]+\.)?{hidden[1]}[.,]", str(raised.value)), (
            f"{hidden}: {raised.value}"
        )


def test_the_config_mapping_is_the_same_both_ways() -> None:
    """llmsched -> vLLM (the reference builder) -> llmsched (the plug-in): each shared field
    given a value other than its default arrives where the table says vLLM keeps it, and
    back in llmsched's config unchanged."""
    chosen: dict[str, Any] = {
        "max_model_len": 300,
        "max_num_seqs": 5,
        "max_num_batched_tokens": 96,
        "max_num_scheduled_tokens": 80,
        "max_num_active_seqs": 3,
        "long_prefill_token_threshold": 40,
        "long_prefill_token_threshold_adaptive": True,
        "async_scheduling": True,
        "watermark": 0.05,
        "scheduler_reserve_full_isl": False,
        "policy": "priority",
        "enable_prefix_caching": False,
        "prefill_schedule_interval": 3,
        "pipeline_parallel_size": 2,
        "disable_chunked_mm_input": True,
    }
    no_chunks = {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": 300,
        "max_num_scheduled_tokens": 300,
    }
    assert {name for name, _, _ in SHARED_FIELDS} == set(chosen) | set(no_chunks)
    for values in (chosen, {**chosen, **no_chunks}):
        theirs = ref.make_vllm_scheduler(block_size=BLOCK, num_gpu_blocks=200, **values)
        ours = ref.scheduler_from(theirs)
        for name, path, _ in SHARED_FIELDS:
            if name in values:
                assert read(theirs.vllm_config, path) == values[name], path
                assert getattr(ours.core.config, name) == values[name], name
