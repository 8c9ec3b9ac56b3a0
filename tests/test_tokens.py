"""`hf_mdm.tokens`: left padding of token lists and the cut at the first EOS, against hand-written answers."""

import torch

from hf_mdm.tokens import after_first_eos, cut_at_eos, eos_index, eos_set, left_pad


def test_left_padding_puts_every_row_last_and_masks_its_pads():
    ids, mask = left_pad([[5, 6, 7], [8], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert ids.dtype == mask.dtype == torch.long


def test_the_cut_at_the_first_eos():
    assert eos_index([4, 2, 9, 2], 2) == 1 and eos_index([4, 9], [2, 3]) is None
    assert cut_at_eos([4, 3, 9, 2], [2, 3]) == [4, 3]
    assert cut_at_eos([4, 3, 9, 2], [2, 3], keep_eos=False) == [4]
    assert cut_at_eos([4, 9], None) == [4, 9]
    assert eos_set(torch.tensor([2, 3])) == eos_set([2, None, 3]) == {2, 3}


def test_after_first_eos_marks_what_cut_at_eos_drops():
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, 6, (64, 9), generator=generator)
    region = torch.rand(64, 9, generator=generator) < 0.7
    eos = torch.tensor([4, 5])
    after = after_first_eos(x, eos, region)
    for row, inside, marked in zip(x.tolist(), region.tolist(), after.tolist()):
        counted = [token if keep else -1 for token, keep in zip(row, inside)]  # EOS outside the region not counted
        kept = len(cut_at_eos(counted, [4, 5]))
        assert marked == [False] * kept + [True] * (len(row) - kept)
    assert not after_first_eos(x, torch.tensor([7])).any()  # no EOS: nothing after it
