"""The lean drafter pass of issue 38 computes what the general one does: the greedy argmax through `max`, the
rotary tables read from a kept table, and a block pass without a mask where every request has the same
committed length."""

import pytest
import torch

import test_models_support
from pdraft.models.layers import Rope, RopeTable
from pdraft.models.sampling import greedy_ids
from test_models_support import MASK, captured, tiny_drafter

target = test_models_support.target  # tiny_target(), a module fixture


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [5, 97, 4096, 4099])
def test_greedy_ids_is_argmax_ties_and_nan_included(dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    few = torch.randint(0, 3, (4, 6, vocab), generator=g).to(dtype)  # many ties
    assert torch.equal(greedy_ids(few), few.argmax(-1))
    first = (few == few.max(-1, keepdim=True).values).int().argmax(-1)  # the first index holding the maximum
    assert torch.equal(greedy_ids(few), first)
    nan = torch.randn(4, 6, vocab, generator=g).to(dtype)
    nan[0, :, vocab // 2] = float("nan")
    assert torch.equal(greedy_ids(nan), nan.argmax(-1))
    assert (greedy_ids(nan)[0] == vocab // 2).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_table_is_bitwise_the_computed_tables(dtype):
    table = RopeTable(16, 10000.0)
    for positions in (torch.tensor([[0, 1, 2, 3]]), torch.tensor([[5, 6, 7], [300, 301, 302]]),
                      torch.tensor([[2000, 2001]])):  # the last two grow the table
        want, got = Rope(positions, 16, 10000.0, dtype), table.rope(positions, dtype)
        assert torch.equal(got.cos, want.cos) and torch.equal(got.sin, want.sin) and got.half == want.half
    assert table.tables[dtype][0].shape[0] >= 2002
    x = torch.randn(2, 3, 2, 16).to(dtype)
    p = torch.tensor([[5, 6], [9, 40]])
    assert torch.equal(table.rope(p, dtype).apply(x), Rope(p, 16, 10000.0, dtype).apply(x))


def masked_block(d, state, anchors, positions):
    """The block pass through the general path: the cache at full capacity and the mask over it."""
    cfg, b, size = d.config, state.batch_size, d.config.block_size
    ids = torch.full((b, size), cfg.mask_token_id, dtype=torch.long)
    ids[:, 0] = anchors
    pos = positions.reshape(b, 1) + torch.arange(size)
    cap = state.keys[0].shape[2]
    ok = torch.arange(cap)[None, :] < state.lengths[:, None]
    mask = torch.cat([ok, torch.ones(b, size, dtype=torch.bool)], dim=1)[:, None, None, :].expand(b, 1, size, cap + size)
    return d.draft_slots(d.backbone(ids, pos, list(zip(state.keys, state.values)), mask))


@pytest.mark.parametrize("kind", ["dflash", "dspark", "dflash2"])
@pytest.mark.parametrize("lens", [[7], [7, 7], [7, 4]])
def test_block_pass_without_a_mask_is_the_masked_pass(target, kind, lens):
    d = tiny_drafter(kind, target, **({"selector_top_k": 4} if kind == "dflash2" else {}))
    g = torch.Generator().manual_seed(11)
    seq = torch.randint(0, MASK, (len(lens), 12), generator=g)
    hidden = captured(target, seq, d.config.target_layer_ids)
    state = d.new_state(len(lens), 20)
    valid = torch.arange(8)[None, :] < torch.tensor(lens)[:, None]
    d.extend_context(state, hidden[:, :8], torch.arange(8).expand(len(lens), 8), valid)
    ctx, mask = d._block_context(state, d.config.block_size)
    assert (mask is None) == (len(set(lens)) == 1)  # sliced to the one committed length, or masked
    if mask is None:
        assert ctx[0][0].shape[2] == lens[0]
    anchors, positions = seq[torch.arange(len(lens)), lens], torch.tensor(lens)
    with torch.no_grad():
        torch.testing.assert_close(d.block_hidden(state, anchors, positions), masked_block(d, state, anchors, positions),
                                   rtol=1e-5, atol=1e-5)


def test_context_write_run_is_the_indexed_write():
    """At batch 1 a write that continues the committed context is two slice copies (ContextCache._write_run);
    what lands in the cache is what the indexed scatter writes, and any other write still takes the scatter."""
    from pdraft.models.context_cache import ContextCache

    g = torch.Generator().manual_seed(5)
    fast, slow = (ContextCache.allocate(2, 1, 3, 4, 16, dtype=torch.float32, device=torch.device("cpu")) for _ in "ab")
    for start, t in ((0, 5), (5, 3), (8, 4)):
        k, v = torch.randn(2, 1, 3, t, 4, generator=g), torch.randn(2, 1, 3, t, 4, generator=g)
        pos, valid = torch.arange(start, start + t)[None], torch.ones(1, t, dtype=torch.bool)
        assert fast._write_run(k, v, pos, valid) if start == 8 else (fast.write(k, v, pos, valid) is None)
        slow.keys[:, 0, :, start:start + t], slow.values[:, 0, :, start:start + t] = k[:, 0], v[:, 0]
        slow.lengths = slow.lengths + t
    assert torch.equal(fast.keys, slow.keys) and torch.equal(fast.values, slow.values)
    assert torch.equal(fast.lengths, slow.lengths)
    k = torch.randn(2, 1, 3, 2, 4, generator=g)
    assert not fast._write_run(k, k, torch.tensor([[13, 14]]), torch.ones(1, 2, dtype=torch.bool))  # not the next
    assert not fast._write_run(k, k, torch.tensor([[12, 13]]), torch.tensor([[True, False]]))  # padding
    assert not fast._write_run(torch.randn(2, 1, 3, 5, 4), torch.randn(2, 1, 3, 5, 4), torch.arange(12, 17)[None],
                               torch.ones(1, 5, dtype=torch.bool))  # beyond capacity: the scatter grows the cache
