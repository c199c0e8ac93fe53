"""Strategies are policy objects with one protocol, plan(view); strings and lists are aliases."""

import numpy as np
import pytest
import tensorflow as tf

import memgrad
from memgrad._src.checkpointing import api as checkpointing_api
from memgrad.strategies import Budget, Collection, Memory, Speed, Strategy, Tensors
from tests.checkpointing.models import max_relative_error, rewritten


class EveryThirdAdd(Strategy):
    """A user policy: keep every third residual sum."""

    name = "every_third_add"

    def plan(self, view):
        adds = [op.outputs[0] for op in view.activation_ops if op.type == "AddV2"]
        return Tensors(adds[2::3]).plan(view)


def residual(depth, width):
    """A residual tanh chain: ``depth`` weights and its loss."""
    weights = [tf.Variable(tf.random.stateless_normal([width, width], seed=[i, 7]) * 0.3)
               for i in range(depth)]

    def loss_fn(x):
        h = x
        for w in weights:
            h = h + tf.tanh(h @ w)
        return tf.reduce_sum(h * h)

    return weights, loss_fn


def _step(checkpoints):
    weights, loss_fn = residual(depth=12, width=16)

    @tf.function
    def step(x):
        loss = loss_fn(x)
        return tf.gradients(loss, weights), memgrad.gradients(loss, weights, checkpoints=checkpoints)

    return step


@pytest.mark.parametrize("alias, policy", [("memory", Memory()), ("speed", Speed())])
def test_a_string_is_an_alias_for_its_policy_object(alias, policy):
    x = tf.random.stateless_normal([8, 16], seed=[1, 2])
    with memgrad.record_rewrites() as by_alias:
        reference, a = _step(alias)(x)
    with memgrad.record_rewrites() as by_object:
        _, b = _step(policy)(x)
    assert max_relative_error(reference, b) <= 1e-5
    assert max_relative_error(a, b) == 0.0
    assert [e.checkpoints for e in by_alias] == [e.checkpoints for e in by_object]
    assert by_alias[0].mode == by_object[0].mode == alias


def test_a_strategy_is_built_in_by_its_own_declaration_not_by_where_it_lives():
    """memgrad's strategies declare ``built_in``; a user's subclass of one is the user's: its
    plans carry its name, and what it raises reaches the caller instead of a fallback."""
    from memgrad._src.checkpointing.strategies import is_built_in

    assert all(is_built_in(s) for s in (Memory(), Speed(), Collection(), Tensors([]), Budget(0.5)))

    class Mine(Memory):
        name = "mine"

    class Failing(Memory):
        def plan(self, view):
            raise KeyError("the user's own bug")

    assert not is_built_in(Mine()) and not is_built_in(EveryThirdAdd())
    x = tf.random.stateless_normal([8, 16], seed=[1, 2])
    with memgrad.record_rewrites() as log:
        reference, got = _step(Mine())(x)
    assert log[0].mode == "mine" and not log[0].fallback
    assert max_relative_error(reference, got) <= 1e-5
    with pytest.raises(KeyError, match="the user's own bug"):
        _step(Failing())(x)


def test_a_user_strategy_plans_and_is_named_in_the_log():
    x = tf.random.stateless_normal([8, 16], seed=[3, 4])
    with rewritten() as log:
        reference, grads = _step(EveryThirdAdd())(x)
    assert max_relative_error(reference, grads) <= 1e-5
    entry = log.entries[0]
    assert entry.mode == "every_third_add" and entry.checkpoints == 4
    assert entry.plan.tensors and all(t.op.type == "AddV2" for t in entry.plan.tensors)


class HalveUntilFew(Strategy):
    """A user policy with the refinement hook: keep every residual sum, then, seeing each
    rewrite, halve the kept sums while more than ``few`` are kept."""

    name = "halve_until_few"

    def __init__(self, few):
        self.few, self.seen = few, []

    def plan(self, view):
        return Tensors([op.outputs[0] for op in view.activation_ops if op.type == "AddV2"]).plan(view)

    def refine(self, view, plan, grads):
        self.seen.append((len(plan.tensors), [g.graph is view.graph for g in grads]))
        if len(plan.tensors) <= self.few:
            return None
        return Tensors(plan.tensors[1::2]).plan(view)


def test_a_user_strategy_refines_its_plan_after_seeing_each_rewrite():
    strategy = HalveUntilFew(few=3)
    x = tf.random.stateless_normal([8, 16], seed=[5, 6])
    with rewritten() as log:
        reference, grads = _step(strategy)(x)
    assert max_relative_error(reference, grads) <= 1e-5
    # 12 sums kept, then 6, then 3: three rewrites, each seen with its graph's gradients.
    assert [kept for kept, _ in strategy.seen] == [12, 6, 3]
    assert all(all(same) and len(same) == 12 for _, same in strategy.seen)
    entry = log.entries[0]
    assert entry.mode == "halve_until_few" and entry.checkpoints == 3


def test_a_refine_hook_that_misbehaves_is_named(monkeypatch):
    # Each refinement rewrites the gradient again: a lower cap names the same loop in 4
    # rewrites instead of 64.
    monkeypatch.setattr(checkpointing_api, "MAX_REFINEMENTS", 4)

    class ReturnsAList(HalveUntilFew):
        def refine(self, view, plan, grads):
            return []

    class NeverSettles(HalveUntilFew):
        def refine(self, view, plan, grads):
            return plan

    class Refuses(HalveUntilFew):
        def refine(self, view, plan, grads):
            raise ValueError("no plan fits 1 byte")

    with pytest.raises(TypeError, match=r"ReturnsAList.refine\(view, plan, grads\) must return .*Received: list"):
        _step(ReturnsAList(1))(tf.ones([2, 16]))
    with pytest.raises(RuntimeError, match="NeverSettles.refine returned a new plan 4 times"):
        _step(NeverSettles(1))(tf.ones([2, 16]))
    # Its own error reaches the caller: not a fallback to plain backprop.
    with pytest.raises(ValueError, match="no plan fits 1 byte"):
        _step(Refuses(1))(tf.ones([2, 16]))


def test_a_list_of_tensors_is_tensors_and_collection_finds_marks():
    weights, _ = residual(depth=6, width=8)

    @tf.function
    def step(x):
        h, kept = x, []
        for i, w in enumerate(weights):
            h = h + tf.tanh(h @ w)
            if i % 2:
                kept.append(memgrad.mark_checkpoint(h))
        loss = tf.reduce_sum(h * h)
        return (tf.gradients(loss, weights), memgrad.gradients(loss, weights, checkpoints=kept[:2]),
                memgrad.gradients(loss, weights, checkpoints=Collection()))

    with memgrad.record_rewrites() as log:
        reference, listed, collected = step(tf.ones([4, 8]))
    assert max_relative_error(reference, listed) <= 1e-5
    assert max_relative_error(reference, collected) <= 1e-5
    assert [e.mode for e in log] == ["list", "collection"]
    assert [e.checkpoints for e in log] == [2, 3]


def test_budget_figures_are_returned_with_the_plan_not_kept_on_the_object():
    budget = Budget(0.5, margin=0.0)
    with memgrad.record_rewrites() as log:
        _step(budget)(tf.ones([64, 16]))
    details = log[0].plan.details
    assert log[0].mode == "budget"
    assert details["predicted_bytes"] <= 0.5 * details["plain_bytes"] * 1.0001
    assert not hasattr(budget, "last")


def test_record_rewrites_logs_only_inside_its_block():
    step = _step("memory")
    with memgrad.record_rewrites() as log:
        pass
    step(tf.ones([2, 16]))
    assert log == []


def test_bad_strategies_name_what_was_expected():
    step = _step("fastest")
    with pytest.raises(ValueError, match="checkpoints must be one of .* Received: 'fastest'"):
        step(tf.ones([2, 16]))
    with pytest.raises(TypeError, match="Received: int"):
        _step(3)(tf.ones([2, 16]))

    class ReturnsAList(Strategy):
        def plan(self, view):
            return []

    with pytest.raises(TypeError, match="must return a memgrad.strategies.CheckpointPlan.*Received: list"):
        _step(ReturnsAList())(tf.ones([2, 16]))


def test_the_view_a_strategy_receives_is_the_public_forward_graph():
    seen = []

    class Spy(Strategy):
        def plan(self, view):
            seen.append(view)
            return Memory().plan(view)

    _step(Spy())(tf.ones([2, 16]))
    assert isinstance(seen[0], memgrad.strategies.ForwardGraph)
    assert np.all([seen[0].is_forward(op) for op in seen[0].activation_ops])
