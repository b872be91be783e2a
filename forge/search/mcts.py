"""Monte Carlo Tree Search over kernel candidates. Knows nothing of CUDA, LLMs or SQL.

Each node holds one candidate (an opaque payload: source, knobs, ...); the root is the eager baseline
(reward 0). The caller supplies `propose(node) -> payloads` (the policy) and reports each evaluation's
reward: `reward = log(speedup)` for a correct candidate, FAIL for a rejected one.

One step is: select (walk down by UCT, stopping where progressive widening allows a new child), expand
(take the node's next proposal; `expand(node)` does it at a node the caller picks: a failed one to
repair), evaluate (the caller's job; virtual loss marks the path meanwhile so parallel selections spread
out), backpropagate (visits, value, best; prune subtrees that stopped improving).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FAIL = -1.0  # reward of a failed candidate: as bad as a kernel e times slower than eager


@dataclass(eq=False)
class Node:
    """A candidate in the tree."""

    id: int
    payload: Any
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    reward: float | None = None  # this candidate's own reward, once evaluated
    visits: int = 0
    value: float = 0.0  # sum of rewards in the subtree
    best: float = -math.inf  # best reward in the subtree
    since_best: int = 0  # visits since `best` last improved
    pending: int = 0  # evaluations in flight below (virtual loss)
    proposals: list[Any] | None = None  # proposals not yet expanded; None: the policy was never asked
    pruned: bool = False

    def q(self, virtual_loss: float) -> float:
        """Mean reward, counting in-flight evaluations as losses."""
        n = self.visits + self.pending
        return (self.value + self.pending * virtual_loss) / n if n else 0.0


@dataclass
class MCTS:
    """The tree and its four phases; the driver calls `select`, evaluates, then calls `report`."""

    propose: Callable[[Node], list[Any]]
    c: float = 0.2  # exploration weight of UCT (rewards are log-speedups, mostly within [-1, 1])
    alpha: float = 0.5  # progressive widening: at most ceil(k * visits**alpha) children
    k: float = 1.5
    prune_after: int = 10  # visits without a better subtree best before a subtree is pruned
    virtual_loss: float = FAIL
    nodes: dict[int, Node] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.nodes:
            self.root = self._add(None, None, 0)
            self.root.reward = 0.0
            self.root.visits, self.root.best = 1, 0.0
        else:
            self.root = next(n for n in self.nodes.values() if n.parent is None)

    def _add(self, parent: Node | None, payload: Any, node_id: int | None = None) -> Node:
        node = Node(len(self.nodes) if node_id is None else node_id, payload, parent)
        self.nodes[node.id] = node
        if parent is not None:
            parent.children.append(node)
        return node

    def _widen(self, node: Node) -> bool:
        """True if progressive widening lets `node` gain a child now.

        Only evaluated, unpruned children count against the limit, so while children are in flight
        (parallel evaluations) a node may expand others instead of blocking.
        """
        allowed = math.ceil(self.k * max(node.visits, 1) ** self.alpha)
        if sum(1 for c in node.children if not c.pruned and c.reward is not None) >= allowed:
            return False
        if not node.proposals:  # ask the policy (again: it may have new ideas once the old ones are used)
            have = [c.payload for c in node.children]
            node.proposals = [p for p in self.propose(node) if p not in have]  # no twin siblings
        return bool(node.proposals)

    def _uct(self, parent: Node, child: Node) -> float:
        n = child.visits + child.pending
        if n == 0:
            return math.inf
        return child.q(self.virtual_loss) + self.c * math.sqrt(math.log(parent.visits + parent.pending + 1) / n)

    # -- select + expand ------------------------------------------------------------------------
    def select(self) -> Node | None:
        """A new child to evaluate (virtual loss applied along its path), or None when nothing is left."""
        child = self._select_from(self.root)
        self._pend(child)
        return child

    def expand(self, node: Node) -> Node | None:
        """A new child of `node` chosen on purpose, past UCT and widening (the driver's repair of a failed
        node, whose reward UCT would never come back to); None if the policy has nothing for it."""
        if node.pruned:
            return None
        if not node.proposals:
            have = [c.payload for c in node.children]
            node.proposals = [p for p in self.propose(node) if p not in have]
        if not node.proposals:
            return None
        child = self._add(node, node.proposals.pop(0))
        self._pend(child)
        return child

    def graft(self, parent: Node, payload: Any) -> Node:
        """A child of `parent` that no proposal made (Helion's autotuned config of it, forge.search.tune); the
        driver evaluates it and reports it."""
        child = self._add(parent, payload)
        self._pend(child)
        return child

    @staticmethod
    def _pend(n: Node | None) -> None:
        while n is not None:  # virtual loss: in-flight evaluations count as failures for UCT
            n.pending += 1
            n = n.parent

    def _select_from(self, node: Node) -> Node | None:
        if self._widen(node):  # expand: the node's next proposal becomes a child
            assert node.proposals is not None
            return self._add(node, node.proposals.pop(0))
        live = [c for c in node.children if not c.pruned and c.reward is not None]
        for c in sorted(live, key=lambda c: -self._uct(node, c)):  # select by UCT, backtracking if blocked
            found = self._select_from(c)
            if found is not None:
                return found
        if node is not self.root and node.proposals == [] and all(c.pruned for c in node.children):
            node.pruned = True  # exhausted: nothing left to propose below it
        return None

    # -- backpropagate --------------------------------------------------------------------------
    def report(self, node: Node, reward: float) -> None:
        """Record an evaluation of `node` (from `select`) and update its ancestors."""
        node.reward = reward
        n: Node | None = node
        while n is not None:
            n.pending = max(0, n.pending - 1)
            n.visits += 1
            n.value += reward
            if reward > n.best:
                n.best, n.since_best = reward, 0
            else:
                n.since_best += 1
            if n is not self.root and n.since_best >= self.prune_after and n.best < self.root.best:
                n.pruned = True  # this subtree stopped improving and is not where the best lives
            n = n.parent

    def restore(self, node_id: int, parent_id: int | None, payload: Any, reward: float | None) -> Node:
        """Re-create a stored node without evaluating it again; for --resume.

        Important: restore nodes in the order they were evaluated (parents first), so the statistics and
        pruning replay as they happened; a restored payload is taken out of every node's pending
        proposals, so it is never proposed (and evaluated) again anywhere in the tree.
        """
        if parent_id is None:
            self.root.payload = payload
            return self.root
        node = self._add(self.nodes[parent_id], payload, node_id)
        parent = node.parent
        assert parent is not None
        if parent.proposals is None:
            try:
                parent.proposals = list(self.propose(parent))
            except Exception:  # noqa: BLE001 - a parent the policy cannot expand (a payload not its own)
                parent.proposals = []
        for n in self.nodes.values():
            if n.proposals:
                n.proposals = [p for p in n.proposals if p != payload]
        if reward is not None:
            node.pending = 0
            n: Node | None = node
            while n is not None:
                n.pending += 1
                n = n.parent
            self.report(node, reward)
        return node


def reward_of(speedup: float | None) -> float:
    """log(speedup) for a correct candidate; FAIL for a failure (speedup None or not positive)."""
    if speedup is None or speedup <= 0:
        return FAIL
    return max(FAIL, math.log(speedup))
