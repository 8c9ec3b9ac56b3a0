"""`hf_mdm.tokens`: left padding of token lists and the cut at the first EOS, against hand-written answers."""

import torch

from hf_mdm.tokens import cut_at_eos, eos_index, eos_set, left_pad


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
