"""A spy on the model call's caches: which keys/values buffers the denoiser keeps, forward after forward (used by
test_compile_graphs on the CPU and test_cuda under CUDA graphs)."""

from __future__ import annotations

import pytest

from hf_mdm.generation_denoiser import Denoiser


def spy_on_caches(patch: pytest.MonkeyPatch) -> list:
    """For every forward from now on (``patch`` undoes it): the data addresses of the keys/values the denoiser keeps
    after it (its static cache; empty without one), their layers' kinds, and whether a span forward was given that
    cache (True for a full forward)."""
    seen, original = [], Denoiser._forward

    def forward(self, inputs, kwargs):
        logits = original(self, inputs, kwargs)
        kept = self.static
        layers = [] if kept is None else kept.layers
        addresses = tuple(tensor.data_ptr() for layer in layers for tensor in (layer.keys, layer.values))
        kinds = tuple(sorted({type(layer).__name__ for layer in layers}))
        seen.append((addresses, kinds, kwargs.get("cache", kept) is kept))
        return logits

    patch.setattr(Denoiser, "_forward", forward)
    return seen


def assert_one_static_cache(seen: list, forwards: int) -> None:
    """``seen`` (`spy_on_caches`) holds ``forwards`` forwards, all keeping one set of `StaticLayer` buffers, every
    span forward reading them."""
    assert len(seen) == forwards
    assert {kinds for _, kinds, _ in seen} == {("StaticLayer",)}
    assert len({addresses for addresses, _, _ in seen}) == 1
    assert all(same for _, _, same in seen)
