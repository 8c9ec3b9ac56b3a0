"""One streamer per row (`hf_mdm.generation_stopping.Streamer`): each streamed row receives its prompt, then its
tokens as they become final, and what it receives joins to the row's output; rows without a streamer receive
nothing; a row is streamed the same batched, grouped (``batch_invariant``) and alone."""

from __future__ import annotations

import pytest
import torch
from tiny_mdm import tiny_mdm

VOCAB, MASK = 64, 63


class Collect:
    def __init__(self):
        self.chunks: list[list[int]] = []
        self.ended = False

    def put(self, value):
        self.chunks.append(value.flatten().tolist())

    def end(self):
        self.ended = True


@pytest.mark.parametrize("settings", [dict(), dict(transfer="threshold", threshold=0.3), dict(kv_cache="dual")])
def test_each_row_streams_its_own_tokens(settings):
    model = tiny_mdm(vocab_size=VOCAB, mask_token_id=MASK)
    ids = torch.randint(0, MASK - 1, (3, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # row 1 left-padded
    kw = dict(max_new_tokens=16, steps=8, block_length=4, **settings)
    for invariant in (False, True):
        streams = [Collect(), None, Collect()]
        out = model.generate(ids, attention_mask=mask, streamer=streams, batch_invariant=invariant, **kw)
        for b in (0, 2):
            prompt, *rest = streams[b].chunks
            assert prompt == ids[b].tolist() and streams[b].ended
            assert sum(rest, []) == out[b, 5:].tolist()
            assert len(rest) > 1  # final tokens arrive block by block, not at the end
        alone = Collect()
        model.generate(ids[2:3], streamer=alone, **kw)
        assert alone.chunks == streams[2].chunks


def test_a_list_must_have_one_streamer_per_row():
    model = tiny_mdm(vocab_size=VOCAB, mask_token_id=MASK)
    ids = torch.zeros((2, 3), dtype=torch.long)
    with pytest.raises(ValueError, match="one per row"):
        model.generate(ids, streamer=[Collect()], max_new_tokens=4, steps=2)
    with pytest.raises(ValueError, match="batch size 1"):
        model.generate(ids, streamer=Collect(), max_new_tokens=4, steps=2)
