"""The MCTS on synthetic evaluators: it beats random search, spreads parallel work, resumes, prunes."""

import math
import random
import statistics

from forge.search.mcts import FAIL, MCTS, Node, reward_of

KNOBS, VALUES = 6, 4  # 4096 configurations


def best(tree: MCTS) -> Node:
    """The evaluated node with the highest reward (the root if nothing beat eager)."""
    return max((n for n in tree.nodes.values() if n.reward is not None), key=lambda n: n.reward or 0.0)


def landscape(seed: int):
    """A smooth synthetic speedup surface with one optimum and a band of failing configurations."""
    rng = random.Random(seed)
    opt = tuple(rng.randrange(VALUES) for _ in range(KNOBS))
    weights = [rng.uniform(0.5, 1.5) for _ in range(KNOBS)]

    def speedup(cfg):
        if cfg[0] == (opt[0] + 2) % VALUES and cfg[1] == (opt[1] + 2) % VALUES:
            return None  # fails to build or verify
        # from e (at the optimum) down to about 1/e at the far corner: log-speedup in [-1, 1]
        return math.exp(1.0 - sum(w * (c - o) ** 2 for w, c, o in zip(weights, cfg, opt, strict=True)) / 40)

    return opt, speedup


def neighbour_policy(seed: int):
    """Root: a few random configurations; any other node: its one-knob neighbours (new under that node)."""
    rng = random.Random(10_000 + seed)  # not the landscape's stream

    def propose(node):
        if node.payload is None:
            return [tuple(rng.randrange(VALUES) for _ in range(KNOBS)) for _ in range(8)]
        have = {c.payload for c in node.children} | {node.parent.payload}
        out = []
        for i in range(KNOBS):
            for d in (-1, 1):
                v = node.payload[i] + d
                if 0 <= v < VALUES and node.payload[:i] + (v,) + node.payload[i + 1:] not in have:
                    out.append(node.payload[:i] + (v,) + node.payload[i + 1:])
        rng.shuffle(out)
        return out

    return propose


def mcts_evaluations_to_optimum(seed: int) -> int:
    """Distinct configurations evaluated until the optimum is found (a repeat is answered from a cache,
    as forge answers an identical kernel from its build and result caches)."""
    opt, speedup = landscape(seed)
    tree = MCTS(neighbour_policy(seed))
    cache: dict = {}
    while len(cache) < VALUES**KNOBS:
        node = tree.select()
        assert node is not None, "search ran dry before the optimum"
        if node.payload not in cache:
            cache[node.payload] = reward_of(speedup(node.payload))
        tree.report(node, cache[node.payload])
        if node.payload == opt:
            return len(cache)
    return len(cache)


def random_evaluations_to_optimum(seed: int) -> int:
    opt, _ = landscape(seed)
    configs = [tuple((i // VALUES**k) % VALUES for k in range(KNOBS)) for i in range(VALUES**KNOBS)]
    random.Random(seed + 1000).shuffle(configs)
    return configs.index(opt) + 1


def test_mcts_finds_the_optimum_in_fewer_evaluations_than_random_search():
    seeds = range(20)
    mcts = [mcts_evaluations_to_optimum(s) for s in seeds]
    rand = [random_evaluations_to_optimum(s) for s in seeds]
    assert statistics.mean(mcts) < statistics.mean(rand) / 4, (mcts, rand)
    assert sum(m < r for m, r in zip(mcts, rand, strict=True)) >= 15


def test_virtual_loss_spreads_parallel_selections():
    tree = MCTS(neighbour_policy(0))
    picked = [tree.select() for _ in range(6)]
    assert len({id(n) for n in picked}) == 6 and all(n is not None for n in picked)
    assert tree.root.pending == 6
    for n in picked:
        tree.report(n, 0.1)
    assert tree.root.pending == 0 and tree.root.visits == 7


def test_failures_score_worst_and_dead_subtrees_are_pruned():
    assert reward_of(None) == FAIL and reward_of(0.0) == FAIL and reward_of(2.0) == math.log(2.0)
    good = {(0,): 0.5}

    def propose(node):
        if node.payload is None:
            return [(0,), (1,)]
        return [node.payload + (i,) for i in range(3)] if len(node.payload) < 4 else []

    tree = MCTS(propose, prune_after=5, c=2.0)  # much exploration: without pruning it would keep coming back
    for _ in range(60):
        node = tree.select()
        if node is None:
            break
        ok = node.payload[0] == 0
        tree.report(node, good.get(node.payload, 0.2) if ok else FAIL)
    bad = next(c for c in tree.root.children if c.payload == (1,))
    assert bad.pruned and bad.visits < 15
    assert best(tree).payload == (0,)


def test_resume_rebuilds_the_tree_without_re_evaluating():
    _, speedup = landscape(3)
    tree = MCTS(neighbour_policy(3))
    log = []
    for _ in range(40):
        node = tree.select()
        r = reward_of(speedup(node.payload))
        tree.report(node, r)
        log.append((node.id, node.parent.id, node.payload, r))
    again = MCTS(neighbour_policy(3))
    for node_id, parent_id, payload, r in log:
        again.restore(node_id, parent_id, payload, r)
    assert again.root.visits == tree.root.visits and math.isclose(again.root.value, tree.root.value)
    assert best(again).payload == best(tree).payload
    done = {p for _, _, p, _ in log}
    for _ in range(20):
        node = again.select()
        assert node.payload not in done
        again.report(node, reward_of(speedup(node.payload)))
