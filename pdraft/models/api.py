"""The runtime contract between drafters and the rest of pdraft: sampling parameters, the proposal a drafter
returns, the opaque per-batch draft state, and the `Drafter` interface that every family's model implements
(DFlash, DSpark and DFlash2 through the shared backbone, pdraft.models.dflash.model; EAGLE-3's chain in
pdraft/models/eagle3/). The decoding engine codes against this module only; training asks a drafter the
training hooks at the end of the interface (`train_gamma`, `init_from_tokens`, `init_extras`,
`extra_train_loss`) instead of asking what family it is."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from pdraft.errors import PdraftError
from pdraft.temperature import temperature_problem


@dataclass
class SamplingParams:
    """None or temperature == 0 means greedy; a positive temperature is at least pdraft.temperature's floor.
    Checked on construction, so a drafter or the sampling code never
    sees nan, inf or a value out of range (pdraft.decode.settings checks a run's copy again)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off

    def __post_init__(self):
        self.check()

    def check(self) -> None:
        problem = temperature_problem(self.temperature)  # 0, or within the one floor and ceiling
        if problem is not None:
            raise PdraftError(f"temperature: {problem}")
        for name, value, ok, rule in (
            ("top_k", self.top_k, lambda v: v >= 0 and float(v).is_integer(), "an integer >= 0 (0 = off)"),
            ("top_p", self.top_p, lambda v: 0.0 < v <= 1.0, "in (0.0, 1.0]"),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise PdraftError(f"{name} must be a finite number, got {value!r}")
            if not ok(value):
                raise PdraftError(f"{name} must be {rule}, got {value}")


@dataclass
class Proposal:
    tokens: torch.Tensor  # [batch, gamma] long: the drafted tokens
    # [batch, gamma, vocab] float32: the exact distribution each draft token was sampled from (after
    # temperature/top-k/top-p and, for DSpark, after the sequential head). None when greedy.
    probs: torch.Tensor | None
    # [batch, gamma] raw confidence LOGITS, position k = P(k survives | 1..k-1 survived); None without a
    # confidence head.
    confidence: torch.Tensor | None
    # [batch, gamma] float32: max_v q_k(v), the top probability of the distribution draft k is drawn from (its
    # temperature-1 softmax when greedy, where `probs` is None), known before x_k is drawn: the draft-side
    # feature the acceptance estimator reads (pdraft.policies.estimator). None where a drafter cannot give it
    # cheaply (DSpark's fused kernel when greedy, the n-gram lookup). A drafter may give it as a function that
    # computes it, so that a round whose policy never reads it does not pay for it (a softmax's max over the
    # vocabulary for every draft: a tenth of a DFlash pass on a CPU, issue 38): read it through
    # `top_probabilities()`.
    top_prob: torch.Tensor | Callable[[], torch.Tensor] | None = None

    def top_probabilities(self) -> torch.Tensor | None:
        """`top_prob` as a tensor (computed now, once, when the drafter gave a function)."""
        if callable(self.top_prob):
            self.top_prob = self.top_prob()
        return self.top_prob

    def scatter(self, rows: torch.Tensor, batch: int) -> Proposal:
        """This proposal, made for requests `rows` of a `batch`, laid out over the whole batch; the other rows
        get token 0, confidence 0, top probability 0 and a uniform distribution (the engine never verifies them)."""
        def spread(x: torch.Tensor, fill: float) -> torch.Tensor:
            full = torch.full((batch, *x.shape[1:]), fill, dtype=x.dtype, device=x.device)
            full[rows.to(x.device)] = x
            return full
        return Proposal(tokens=spread(self.tokens, 0),
                        probs=None if self.probs is None else spread(self.probs, 1.0 / self.probs.shape[-1]),
                        confidence=None if self.confidence is None else spread(self.confidence, 0.0),
                        top_prob=None if self.top_prob is None else lambda: spread(self.top_probabilities(), 0.0))


@dataclass
class TreeBlock:
    """One backbone pass of a parallel drafter, ready to be drafted as a tree (pdraft.models.tree): `top` is what
    the tree's shape is planned from, `data` whatever the family's `tree_step` reads (hidden states, logits,
    candidate lattice)."""

    top: torch.Tensor  # [batch, G, width] float32: the `width` largest probabilities of each position's
    # draft-side marginal (temperature 1), known before any token is drawn
    data: dict = field(default_factory=dict)


@dataclass
class DraftTree:
    """A tree of drafted tokens under each request's anchor (node 0, the root). Nodes 1..N come parents first
    (by depth), siblings in the order they were drawn; padding nodes are not `real`."""

    tokens: torch.Tensor  # [batch, N] long: node i+1's token
    parents: torch.Tensor  # [batch, N] long: node i+1's parent, 0..i (0 = the root)
    depth: torch.Tensor  # [batch, N] long: 1.. (the root is depth 0)
    real: torch.Tensor  # [batch, N] bool
    # [batch, N+1, vocab] float32: q of each node's children (the root's first), the distribution the first child
    # was drawn from; the next ones were drawn from it without the earlier siblings. None: the children are
    # deterministic (greedy: the top of each node's scores).
    probs: torch.Tensor | None
    width: int  # most children of a node
    max_depth: int  # deepest node allowed (gamma)

    @property
    def nodes(self) -> int:
        return self.tokens.shape[1]

    def scatter(self, rows: torch.Tensor, batch: int) -> DraftTree:
        """This tree, drafted for requests `rows` of a `batch`, laid out over the whole batch; the other rows
        get no real node."""
        def spread(x: torch.Tensor, fill) -> torch.Tensor:
            full = torch.full((batch, *x.shape[1:]), fill, dtype=x.dtype, device=x.device)
            full[rows.to(x.device)] = x
            return full
        return DraftTree(spread(self.tokens, 0), spread(self.parents, 0), spread(self.depth, 1),
                         spread(self.real, False), None if self.probs is None else spread(self.probs, 0.0),
                         self.width, self.max_depth)

    def ancestors(self) -> torch.Tensor:
        """[batch, N+1, N+1] bool: [b, i, j] = node j is node i or one of its ancestors (the root included); padding
        nodes see only themselves."""
        batch, n = self.tokens.shape
        dev = self.tokens.device
        eye = torch.eye(n + 1, dtype=torch.bool, device=dev).expand(batch, n + 1, n + 1)
        up = torch.zeros(batch, n + 1, n + 1, dtype=torch.bool, device=dev)  # [b, i, j]: j is i's parent
        up[torch.arange(batch, device=dev).unsqueeze(1), torch.arange(1, n + 1, device=dev), self.parents] = True
        anc = eye.clone()
        step = up
        for _ in range(self.max_depth):  # ancestors k levels up, k = 1..depth
            anc |= step
            if not bool(step.any()):
                break
            step = (step.float() @ up.float()).bool()
        real = torch.cat([torch.ones(batch, 1, dtype=torch.bool, device=dev), self.real], dim=1)
        return torch.where(real.unsqueeze(2), anc, eye)

    def shape(self, row: int) -> list[int]:
        """Real nodes per depth 1..max_depth of request `row` (the chain is [1, 1, ..., 1])."""
        d = self.depth[row][self.real[row]]
        return torch.bincount(d.cpu(), minlength=self.max_depth + 1)[1:].tolist()


@dataclass
class DraftState:
    """Per-batch incremental drafter context. For every draft layer it holds the keys and values of the
    projected context features (RoPE already applied at each token's absolute position) of every committed
    token whose target hidden states are known, padded to a common capacity; `lengths[b]` says how many of
    request b's entries are real. Opaque to the engine: only the drafter reads or writes it; the engine only
    calls `select` to drop requests that finished (drafters with their own state type override it)."""

    keys: list[torch.Tensor] = field(default_factory=list)  # per layer [batch, kv_heads, capacity, head_dim]
    values: list[torch.Tensor] = field(default_factory=list)  # per layer [batch, kv_heads, capacity, head_dim]
    lengths: torch.Tensor | None = None  # [batch] long

    @property
    def batch_size(self) -> int:
        return 0 if self.lengths is None else int(self.lengths.shape[0])

    def select(self, rows: torch.Tensor) -> DraftState:
        """A copy holding requests `rows` only, in that order."""
        rows = rows.to(self.lengths.device)
        return DraftState(keys=[k.index_select(0, rows) for k in self.keys],
                          values=[v.index_select(0, rows) for v in self.values],
                          lengths=self.lengths.index_select(0, rows))

    def place(self, rows: torch.Tensor, other: DraftState) -> None:
        """Continuous batching (pdraft.decode.proposer): write the one-request state `other` into row `rows` of
        this one, in place. A state type that does not provide it cannot take a new request in a row."""
        raise PdraftError(f"{type(self).__name__} cannot take a new request in a row (continuous batching needs "
                          "DraftState.place)")


@dataclass
class TrainOutput:
    """Teacher-forced outputs for N blocks per sequence; G = max_gamma, draft i is the token at anchor + i."""

    base_logits: torch.Tensor | None  # [batch, N, G, vocab] backbone logits U_k (None: compute_logits=False)
    logits: torch.Tensor | None  # [batch, N, G, vocab] after the sequential head (== base_logits for DFlash)
    confidence_logits: torch.Tensor | None  # [batch, N, G] raw logits of eq. 7, or None
    target_ids: torch.Tensor  # [batch, N, G] long: the true tokens at anchor + 1 .. anchor + G (clamped)
    prev_ids: torch.Tensor  # [batch, N, G] long: the true tokens at anchor + 0 .. anchor + G - 1
    label_valid: torch.Tensor  # [batch, N, G] bool: anchor + i < seq_len
    hidden: torch.Tensor  # [batch, N, G, hidden] backbone outputs h_k after the final norm
    seq_features: torch.Tensor | None = None  # [batch, N, G, r] sequential-head features u_k (bias = u_k W2)
    # [r, vocab]: the W2 the chunked losses multiply seq_features by. Returned from inside the forward so that
    # FSDP hands out the gathered matrix and its gradient reaches the shards (None without a sequential head).
    seq_w2: torch.Tensor | None = None
    # A drafter with its own output head (EAGLE-3): head [V_d, hidden] turns `hidden` into its logits instead of
    # the target's LM head (returned from inside the forward for FSDP, as seq_w2), and vocab [V_d] long holds the
    # target id of each of its rows (None: its rows are the target vocabulary in order).
    head: torch.Tensor | None = None
    vocab: torch.Tensor | None = None


class Drafter(nn.Module):
    """Interface of a drafter. `config` has at least: kind, target_layer_ids (pdraft convention: id i =
    transformers hidden_states[i + 1]), has_confidence, hidden_size, vocab_size (the parallel families' configs
    also block_size, mask_token_id, block_convention, denoise_steps).

    What a family may provide beyond the required methods is declared here with a default, and the engine reads
    the declaration instead of probing the object (the whole contract, for a new family: docs/DRAFTERS.md):
    - `compilable_pass`: whether decode.compile may compile `propose` (pdraft.decode.backend.drafter_pass);
    - `set_fused_kernels`: the family's fused kernels switched by decode.fused_kernels;
    - its state's `DraftState.place`: taking a new request in a row, which continuous batching needs;
    - the drafting kind (one pass per block or one pass per draft) is its FamilySpec's `drafting`."""

    config: object
    # True: `propose` is one pass of fixed shapes per (batch, gamma, state capacity), which decode.compile
    # compiles once per drafter (the parallel backbone, pdraft.models.dflash.model). False (the default): it runs
    # as written, even on a compiled run: EAGLE-3's chain, the n-gram lookup and the tests' doubles.
    compilable_pass = False
    # (token embedding, LM head) of the target once attached: a plain attribute, not a submodule, never saved
    _shared: tuple[nn.Module, nn.Module] | None = None

    def attach_target(self, target_model: nn.Module) -> None:
        """Share the target's token embedding and LM head (frozen, never saved with the drafter), after checking
        that both have the drafter's (vocab, hidden) shape."""
        embed, head = target_model.get_input_embeddings(), target_model.get_output_embeddings()
        want = (self.config.vocab_size, self.config.hidden_size)
        for name, mod in (("token embedding", embed), ("LM head", head)):
            if mod is None or tuple(mod.weight.shape) != want:
                got = None if mod is None else tuple(mod.weight.shape)
                raise PdraftError(f"target {name} has shape {got}, the drafter needs {want} (vocab, hidden)")
            mod.requires_grad_(False)  # frozen: the drafter never trains them
        self._shared = (embed, head)

    def _target(self) -> tuple[nn.Module, nn.Module]:
        if self._shared is None:
            raise PdraftError("the drafter has no target attached: call attach_target(target_model) first")
        return self._shared

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] long -> the target's token embeddings [..., hidden] in the dtype of the drafter's fusion
        layer `fc` (every family fuses the captured target layers through one)."""
        return self._target()[0](ids).to(self.fc.weight.dtype)

    def check_weights(self, tensors: dict[str, torch.Tensor], where: str) -> None:
        """Refuse, in one line naming `where`, weights that have the right names, shapes and finite values and
        still cannot be used (EAGLE-3's vocabulary maps). Called as a checkpoint loads and before one is written
        (pdraft.models.checkpoint); a family without such weights checks nothing more."""

    def max_gamma(self) -> int:
        """deepspec convention: block_size; zlab convention: block_size - 1."""
        raise NotImplementedError

    def set_fused_kernels(self, on: bool) -> None:
        """decode.fused_kernels: turn the family's fused Triton kernels on or off (they run on CUDA only). The
        default has none to switch, and leaves the drafter as it is (DSpark's sequential head has one)."""

    def new_state(self, batch_size: int, capacity: int | None = None) -> DraftState:
        """An empty state for `batch_size` requests whose context reaches at most `capacity` positions (the
        engine gives it, so the state is allocated once per run); None = grow as needed."""
        raise NotImplementedError

    def extend_context(self, state: DraftState, target_hidden: torch.Tensor, positions: torch.Tensor,
                       valid: torch.Tensor | None = None, token_ids: torch.Tensor | None = None) -> None:
        """target_hidden: [batch, t, len(target_layer_ids) * target_hidden] for t new committed tokens;
        positions: [batch, t] long absolute positions; valid: [batch, t] bool (False = padding); token_ids:
        [batch, t] long, the committed token at each position (the engine always passes them; a drafter that
        pairs features with tokens, EAGLE-3, needs them, the parallel families ignore them)."""
        raise NotImplementedError

    def propose(self, state: DraftState, anchor_ids: torch.Tensor, anchor_positions: torch.Tensor, gamma: int,
                sampling: SamplingParams | None = None, uniforms: torch.Tensor | None = None) -> Proposal:
        """Draft `gamma` tokens after the anchor (the last committed token, not yet run through the target).
        When sampling, draft k of request b is drawn by inverse CDF from uniforms[b, k] ([batch, gamma], in
        [0, 1), any device: the engine's per-request streams); None draws fresh ones."""
        raise NotImplementedError

    # ---- trees (pdraft.models.tree): parallel drafters only -------------------------------------------
    def tree_block(self, state: DraftState, anchor_ids: torch.Tensor, anchor_positions: torch.Tensor,
                   width: int) -> TreeBlock:
        """One drafting pass for a tree of up to `width` children per node: anchor_ids [batch] -> TreeBlock."""
        raise PdraftError(f"{type(self).__name__} cannot draft a tree: tree verification needs a parallel drafter "
                          "(DFlash, DSpark or DFlash2)", hint="verify a chain (no --tree)")

    def tree_step(self, block: TreeBlock, depth: int, rows: torch.Tensor, prev_ids: torch.Tensor, carry,
                  sampling: SamplingParams | None):
        """The distribution of the children of M nodes at depth `depth` - 1: rows [M] (their requests), prev_ids
        [M] (their tokens), carry (what the step that drew them returned for their parents; None at depth 1).
        -> (scores [M, vocab] float32, ranked when greedy, -inf where no child may be; probs [M, vocab] the q
        children are drawn from when sampling, else None; carry [M, ...] or None for their children)."""
        raise PdraftError(f"{type(self).__name__} cannot draft a tree")

    # ---- training (pdraft.train.loop) -------------------------------------------------------------------
    # True for a drafter whose fresh parameters depend on the training data: the trainer then calls
    # init_from_tokens with the token counts of the training responses before the first step.
    needs_token_counts = False

    def train_gamma(self) -> int:
        """Draft positions per anchor its training pass supervises (forward_train's G): the block, or an
        autoregressive drafter's unrolled steps, which may be fewer than it drafts at decode time."""
        return self.max_gamma()

    def init_from_tokens(self, counts: torch.Tensor) -> None:
        """counts [vocab] long: how often each token occurs among the training responses (loss-mask tokens);
        called once on a fresh drafter, after attach_target, when `needs_token_counts` (EAGLE-3: its draft
        vocabulary and the start of its LM head)."""

    def init_extras(self, std: float = 0.02) -> None:
        """Called once after every Linear and Embedding was drawn from N(0, std) (pdraft.models.build): restore
        the parameters whose starting point is something else (DFlash2's identity convolutions)."""

    def extra_train_loss(self, out, *, valid: torch.Tensor, weights: torch.Tensor,
                         target_hidden: torch.Tensor | None = None, target_rows: torch.Tensor | None = None,
                         target_head: torch.Tensor | None = None, **loss_weights):
        """A family's own training term beside the shared CE / TV / confidence losses, or None. `out` is
        forward_train's output; valid [b, N, G] the supervised positions; weights [b, N, G] the position
        weights; target_hidden [T, hidden_t] the target's last (final-norm) hidden states, target_rows [b, N, G]
        the row of it whose distribution each position is trained against (the rows the shared TV loss reads)
        and target_head [vocab, hidden_t] the target's LM head, so a term may use the target's distribution;
        `loss_weights` the values of the recipe `train.*` keys the family adds (its FamilySpec's
        train_fields). Returns an object with `.loss` (a differentiable scalar, added to the loss) and
        `.metrics()` ({name: float}, logged as means over the logging window beside the shared figures)."""
        return None

