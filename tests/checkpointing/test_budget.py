"""memgrad.strategies.Budget: the planner against sqrt(n) spacing and against brute force, the
error for budgets no plan fits, the walk over candidates, and the entry points. (The model's and
the Budget's figures against measured peaks are `scripts/budget_accuracy.py --check`; plans the
same in fresh processes and held when measured: test_budget_determinism.py.)"""

import itertools
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import memgrad
from memgrad._src.checkpointing.budget_planner import Planner, budget_curve
from memgrad._src.checkpointing.budget_walk import BudgetWalk, next_candidate
from memgrad._src.graph import ForwardGraph, MemoryModel, gradient_reads
from tests.checkpointing.budget_workloads import sqrt_spacing
from tests.checkpointing.budget_workloads import LAYER_OUTPUT, WORKLOADS
from tests.checkpointing.models import loss_fn, max_relative_error, residual, rewritten

MiB = 2**20


def _model(name):
    weights, loss_fn_, shape = WORKLOADS[name]()
    out = {}

    @tf.function(autograph=False)
    def trace(x):
        loss = loss_fn_(x)
        view = ForwardGraph([loss], weights)
        out["view"], out["model"] = view, MemoryModel(view)
        return loss

    trace.get_concrete_function(tf.TensorSpec(shape))
    return out["view"], out["model"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["residual", "tanh_chain", "dense_blocks", "uneven"])
def test_planner_never_costs_more_than_sqrt_spacing_at_its_predicted_peak(name):
    view, model = _model(name)
    sqrt_cuts = model.positions_of(sqrt_spacing(model, LAYER_OUTPUT[name]))
    sqrt_peak, sqrt_flops = model.predict(sqrt_cuts)
    cuts, peak, flops = Planner(view, model).plan(sqrt_peak)
    print(f"{name}: planner {flops / 1e9:.2f} GFLOP at {peak / MiB:.1f} MiB, sqrt(n) "
          f"{sqrt_flops / 1e9:.2f} GFLOP at {sqrt_peak / MiB:.1f} MiB")
    assert peak <= sqrt_peak
    assert flops <= sqrt_flops
    if name == "uneven":
        assert flops < 0.9 * sqrt_flops


def test_dynamic_program_matches_brute_force_on_a_chain():
    view, model = _model("uneven")
    planner = Planner(view, model)
    candidates = planner.candidates
    assert 10 <= len(candidates) <= 60
    # Every subset of a dozen candidate positions, against the DP restricted to them.
    chosen = candidates[::max(1, len(candidates) // 12)][:12]
    planner.candidates = chosen
    plain = planner.plain_bytes
    plans = [model.predict(list(c)) + (c,) for k in range(len(chosen) + 1)
             for c in itertools.combinations(chosen, k)]
    for fraction in (0.3, 0.45, 0.6, 0.8):
        budget = fraction * plain
        feasible = [flops for peak, flops, _ in plans if peak <= budget]
        cuts = planner.solve(budget)
        if not feasible:
            assert cuts is None
            continue
        peak, flops = model.predict(cuts)
        assert peak <= budget
        assert flops == pytest.approx(min(feasible), rel=1e-9), fraction


def _tanh_chain_tracer(batch=256):
    """``(trace, weights, loss_fn, shape)``: ``trace(budget)`` traces memgrad.gradients of a
    ``batch``-row tanh chain under that budget (raising BudgetError as planning does)."""
    weights, loss_fn_, shape = WORKLOADS["tanh_chain"](batch=batch)
    x = tf.ones(shape)

    def trace(budget):
        @tf.function
        def fn(x):
            return memgrad.gradients(loss_fn_(x), weights, checkpoints=budget)
        return fn.get_concrete_function(x)

    return trace, weights, loss_fn_, shape


def test_band_winners_match_a_sort_on_band_flops_and_kept():
    """The dynamic program's per-band choice: fewest FLOPs, then fewest kept bytes, then the
    first transition, as a stable sort on (band, FLOPs, kept) picks; with many exact ties."""
    from memgrad._src.checkpointing.budget_planner import _band_winners

    rng = np.random.default_rng(3)
    for size, bands in ((1, 1), (50, 4), (5000, 64), (20000, 256)):
        band = rng.integers(0, bands, size)
        flops = rng.integers(0, 6, size).astype(float)   # few values: ties within a band
        kept = rng.integers(0, 4, size).astype(float)
        order = np.lexsort((kept, flops, band))
        first = np.concatenate([[True], band[order][1:] != band[order][:-1]])
        pick, dest = _band_winners(band, flops, kept, bands)
        np.testing.assert_array_equal(pick, order[first])
        np.testing.assert_array_equal(dest, band[order][first])


def test_a_long_chain_of_identical_layers_keeps_cut_positions_for_the_planner():
    """Past DENSE_LIMIT positions the planner keeps the live bytes' local minima; a chain of
    identical layers has one flat plateau, whose last position was its only candidate: no
    plan at half of plain's peak but the 'memory' placements."""
    from memgrad._src.checkpointing.budget_planner import DENSE_LIMIT

    model = keras.Sequential([keras.Input((16,))]
                             + [keras.layers.Dense(16, activation="relu") for _ in range(300)])
    found = {}

    @tf.function(autograph=False)
    def step(x):
        loss = tf.reduce_sum(model(x))
        planner = Planner(ForwardGraph([loss], model.trainable_variables))
        found.update(candidates=len(planner.candidates), positions=planner.n,
                     half=planner.solve(0.5 * planner.plain_bytes))
        return loss

    step.get_concrete_function(tf.TensorSpec([64, 16]))
    assert found["positions"] > DENSE_LIMIT  # the thinning applies
    assert DENSE_LIMIT // 2 <= found["candidates"] <= DENSE_LIMIT
    assert found["half"]  # the dynamic program finds a plan at half of plain's peak


def test_budget_below_any_plan_states_the_smallest_feasible():
    step, weights, loss_fn_, shape = _tanh_chain_tracer()

    # The memory model's planner alone: the smallest feasible budget is the model's.
    with pytest.raises(memgrad.BudgetError, match="Expected a budget of at least") as info:
        step(memgrad.strategies.Budget("64KiB", simulate=False))
    message = str(info.value)
    assert "64.00 KiB" in message
    view, model = _model_of(loss_fn_, weights, shape)
    smallest = Planner(view, model).smallest_feasible()
    budget = memgrad.strategies.Budget(int(smallest * 1.001), margin=0.0, simulate=False)
    with memgrad.record_rewrites() as log:
        step(budget)  # fits
    assert log[-1].plan.details["predicted_bytes"] <= smallest * 1.001
    with pytest.raises(memgrad.BudgetError):
        step(memgrad.strategies.Budget(int(smallest * 0.98), margin=0.0, simulate=False))


def test_budget_below_any_plan_names_the_smallest_that_fits():
    """The smallest budget named is the least modelled peak of any plan; that budget is
    accepted (planning is deterministic), and 3% less is refused. The gradients are consumed as made: held, the weights' 12 MiB of gradients
    leave little room between plans on 256 rows."""
    step, *_ = _tanh_chain_tracer()

    with pytest.raises(memgrad.BudgetError, match="Expected a budget of at least") as info:
        step(memgrad.strategies.Budget("64KiB", margin=0.0, hold_gradients=False))
    smallest = memgrad.profiler.parse_bytes(
        re.search(r"Expected a budget of at least ([0-9.]+ \w+)", str(info.value)).group(1))
    with memgrad.record_rewrites() as log:
        step(memgrad.strategies.Budget(int(smallest * 1.001), margin=0.0, hold_gradients=False))  # fits
    details = log[-1].plan.details
    assert details["scale_source"] == "model"
    assert details["predicted_bytes"] <= smallest * 1.001
    with pytest.raises(memgrad.BudgetError):
        step(memgrad.strategies.Budget(int(smallest * 0.97), margin=0.0, hold_gradients=False))


def test_a_step_with_a_loop_is_told_the_loops_per_step_memory_is_not_modelled():
    """A loop's per-step intermediates (its gradient's TensorLists) are not in the memory
    model: the Budget warns, records the loops it saw, and its refusals say so too. The
    gradients stay exact."""
    w = tf.Variable(tf.random.stateless_normal([16, 16], [0, 1]) * 0.3)
    xs = tf.random.stateless_normal([12, 4, 16], [2, 3])

    @tf.function
    def step(budget):
        h = tf.scan(lambda h, x: tf.tanh(tf.matmul(h + x, w)), xs, initializer=tf.zeros([4, 16]))
        loss = tf.reduce_sum(tf.square(h))
        return tf.gradients(loss, [w])[0], memgrad.gradients(loss, [w], checkpoints=budget)[0]

    with pytest.warns(UserWarning, match=r"1 loop\(s\).*per-step intermediates"):
        with memgrad.record_rewrites() as log:
            plain, mine = step(memgrad.strategies.Budget(1.0))
    assert log[-1].plan.details["loops"] == 1
    np.testing.assert_allclose(mine.numpy(), plain.numpy(), rtol=1e-5, atol=1e-7)
    with pytest.warns(UserWarning), pytest.raises(memgrad.BudgetError, match="per-step intermediates"):
        step(memgrad.strategies.Budget("1KiB"))


def test_fractional_budget_below_any_plan_names_the_smallest_fraction_that_fits():
    step, *_ = _tanh_chain_tracer()
    slack, under = 1.0, 0.97

    with pytest.raises(memgrad.BudgetError, match=r"Expected a fraction of at least 0\.\d+") as info:
        step(memgrad.strategies.Budget(0.01, margin=0.0, hold_gradients=False))
    assert "Budget(0.01)" in str(info.value)
    smallest = float(re.search(r"a fraction of at least ([0-9.]+)", str(info.value)).group(1))
    assert 0.01 < smallest < 1.0
    fraction = min(1.0, smallest * slack)
    with memgrad.record_rewrites() as log:
        step(memgrad.strategies.Budget(fraction, margin=0.0, hold_gradients=False))  # it fits
    details = log[-1].plan.details
    assert details["predicted_bytes"] <= fraction * details["plain_bytes"]
    with pytest.raises(memgrad.BudgetError):
        step(memgrad.strategies.Budget(smallest * under, margin=0.0, hold_gradients=False))


def test_a_budget_the_least_plan_fits_only_without_the_margin_is_refused_naming_one_with_it():
    """Below every candidate less the margin but within the least one's simulated peak: the
    step could measure over it (steps ran up to 1.27x their plan's simulated peak), so it is
    refused, naming the least peak plus the margin; that budget is accepted, in every trace
    (simulated figures do not move)."""
    step, *_ = _tanh_chain_tracer()
    with pytest.raises(memgrad.BudgetError) as info:
        step(memgrad.strategies.Budget("64KiB", margin=0.0, hold_gradients=False))
    least = memgrad.profiler.parse_bytes(  # no margin: the least simulated peak
        re.search(r"Expected a budget of at least ([0-9.]+ \w+)", str(info.value)).group(1))
    with pytest.raises(memgrad.BudgetError, match="with the 20% margin") as info:
        step(memgrad.strategies.Budget(int(least * 1.05), hold_gradients=False))
    named = memgrad.profiler.parse_bytes(
        re.search(r"Expected a budget of at least ([0-9.]+ \w+)", str(info.value)).group(1))
    assert named == pytest.approx(least / 0.8, rel=0.01)
    for _ in range(2):
        with memgrad.record_rewrites() as log:
            step(memgrad.strategies.Budget(int(named * 1.001), hold_gradients=False))
        assert log[-1].plan.details["predicted_bytes"] <= 0.8 * named * 1.001


def test_budget_is_monotone_and_picks_the_cheapest_candidate_that_fits():
    """Over a sweep of budgets, each Budget keeps the cheapest of one shared set of candidate
    plans whose peak fits: a smaller budget never gets less recomputation nor a larger
    (simulated) peak; every candidate tried that recomputes less than the one kept was over
    the target. The gradients are consumed as made here (``hold_gradients=False``): held,
    the weights' 12 MiB of gradients leave no room between plans on 256 rows."""
    step, *_ = _tanh_chain_tracer(batch=256)
    chosen = []
    for fraction in (1.0, 0.8, 0.6, 0.5, 0.45, 0.4):
        try:
            with memgrad.record_rewrites() as log:
                step(memgrad.strategies.Budget(fraction, hold_gradients=False))
        except memgrad.BudgetError:
            break
        details = log[-1].plan.details
        assert details["predicted_bytes"] <= details["budget_bytes"]
        if details["candidate"] is not None:
            # Plain backprop's peak was over the target, and so was every candidate tried
            # that recomputes less than the one kept (the walk up from the model's guess, or
            # a bisection where the model puts them all too far over).
            assert details["tried_bytes"][0] > details["target_bytes"]
            tried = log[-1].plan.strategy_state.peak_by_candidate  # candidate index -> its peak
            assert all(peak > details["target_bytes"] for index, peak in tried.items()
                       if index < details["candidate"]), (tried, details["candidate"])
        chosen.append((fraction, details["predicted_bytes"], details["recomputed_flops"]))
    assert len(chosen) >= 4, chosen
    peaks = [peak for _, peak, _ in chosen]
    flops = [cost for _, _, cost in chosen]
    assert peaks == sorted(peaks, reverse=True), chosen
    assert flops == sorted(flops), chosen
    assert peaks[-1] < 0.6 * peaks[0], chosen  # the sweep reached real savings


def _assigning_step(checkpoints, batch=256):
    """A tanh chain's step applying each gradient as soon as it is made (one ``assign_sub``
    per weight), with ``checkpoints``; and its input."""
    weights, loss_fn_, shape = WORKLOADS["tanh_chain"](batch=batch)

    @tf.function
    def step(x):
        loss = loss_fn_(x)
        for w, g in zip(weights, memgrad.gradients(loss, weights, checkpoints=checkpoints)):
            w.assign_sub(1e-6 * g)
        return loss

    return step, tf.ones(shape)


def test_hold_gradients_false_accepts_a_budget_the_default_refuses_on_a_step_that_consumes_them():
    """On a tanh chain whose weights' gradients (12 MiB) outweigh 'memory''s activations, the
    least budget that fits with each gradient consumed as made (``hold_gradients=False``) is
    accepted with a real plan, and refused by the default, which counts every gradient
    alive to the end of the backward pass. (Measured on such a step: 
    test_budget_determinism.py.)"""
    with pytest.raises(memgrad.BudgetError, match="Expected a budget of at least") as info:
        step, x = _assigning_step(memgrad.strategies.Budget("64KiB", hold_gradients=False))
        step.get_concrete_function(x)
    least = memgrad.profiler.parse_bytes(
        re.search(r"Expected a budget of at least ([0-9.]+ \w+)", str(info.value)).group(1))
    budget = int(least * 1.001)  # the figure is named to two decimals
    with memgrad.record_rewrites() as log:
        step, x = _assigning_step(memgrad.strategies.Budget(budget, hold_gradients=False))
        step.get_concrete_function(x)
    details = log[-1].plan.details
    assert details["scale_source"] == "model"
    assert details["recomputed_flops"] > 0  # a real plan, not plain backprop
    with pytest.raises(memgrad.BudgetError, match="Expected a budget of at least"):
        step, x = _assigning_step(memgrad.strategies.Budget(budget))
        step.get_concrete_function(x)


def _model_of(loss_fn_, weights, shape):
    out = {}

    @tf.function(autograph=False)
    def trace(x):
        loss = loss_fn_(x)
        out["view"] = ForwardGraph([loss], weights)
        out["model"] = MemoryModel(out["view"])
        return loss

    trace.get_concrete_function(tf.TensorSpec(shape))
    return out["view"], out["model"]


@pytest.mark.parametrize("bad, error", [
    (True, TypeError), ([1], TypeError), (1.5, ValueError), (0.0, ValueError),
    ("lots", ValueError), (-5, ValueError),
])
def test_bad_budgets_are_rejected(bad, error):
    with pytest.raises(error, match="Received"):
        memgrad.strategies.Budget(bad)
    with pytest.raises(ValueError, match="margin"):
        memgrad.strategies.Budget("1MiB", margin=1.0)
    with pytest.raises(TypeError, match="scratch must be True or False. Received: 'yes'"):
        memgrad.strategies.Budget("1MiB", scratch="yes")
    with pytest.raises(TypeError, match="hold_gradients must be True, False or None. Received: 1"):
        memgrad.strategies.Budget("1MiB", hold_gradients=1)


def test_budget_counts_an_xla_calls_temporary_buffer():
    """A 16 MiB temporary inside an XLA-compiled call is counted in a simulating Budget's
    plain peak when kernels' scratch is counted (the default), not without."""
    weights = [tf.Variable(tf.random.normal([256, 2048], seed=1))]

    @tf.function(jit_compile=True)
    def inner(x, w):
        return tf.reduce_sum(tf.tanh(tf.matmul(x, w)))

    def plain_for(budget):
        @tf.function
        def step(x):
            return memgrad.gradients(inner(x, weights[0]) * 2.0, weights, checkpoints=budget)

        with memgrad.record_rewrites() as log:
            step.get_concrete_function(tf.TensorSpec([2048, 256]))
        return log[-1].plan.details["plain_bytes"]

    with_scratch = plain_for(memgrad.strategies.Budget(1.0, simulate=True))
    without = plain_for(memgrad.strategies.Budget(1.0, simulate=True, scratch=False))
    assert with_scratch >= without + 15 * 2**20, (with_scratch / 2**20, without / 2**20)


def test_under_xla_a_budget_plans_on_the_model_and_traces_nothing_on_the_side():
    """In a graph traced for XLA a Budget plans on the memory model alone: a simulation's
    side gradient and candidate rewrites would stay in the graph and XLA compiles them too
    (a refused candidate's loop once held an op XLA cannot compile)."""
    w = tf.Variable(tf.random.stateless_normal([64, 64], [3, 4]) * 0.1)

    def loss_fn_(x):
        h = x
        for _ in range(12):
            h = h + tf.tanh(h @ w)
        return tf.reduce_sum(h ** 2)

    graphs = {}

    @tf.function(jit_compile=True, autograph=False)
    def step(x):
        graphs["step"] = tf.compat.v1.get_default_graph()
        loss = loss_fn_(x)
        return (memgrad.gradients(loss, [w], checkpoints=memgrad.strategies.Budget(0.8)),
                tf.gradients(loss, [w]))

    x = tf.random.stateless_normal([256, 64], [5, 6])
    with memgrad.record_rewrites() as log:
        got, expected = step(x)
    assert max_relative_error(expected, got) <= 1e-5
    assert log[0].plan.details["scale_source"] == "model", log[0].plan.details
    names = [op.name for op in graphs["step"].get_operations()]
    assert not [n for n in names if "memgrad_budget_plain" in n]


@pytest.mark.slow
def test_budget_through_gradients_tape_and_fit_hook_gives_tf_gradients():
    model, _, _ = residual(depth=16, width=32)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((1024, 32)).astype("float32"))
    y = tf.constant(rng.integers(0, 10, size=(1024,)).astype("int32"))
    variables = model.trainable_variables
    budget = memgrad.strategies.Budget(0.6)

    @tf.function
    def step(x, y):
        reference = tf.gradients(loss_fn(y, model(x, training=True)), variables)
        direct = memgrad.gradients(loss_fn(y, model(x, training=True)), variables,
                                   checkpoints=budget)
        with memgrad.GradientTape(checkpoints=budget) as tape:
            loss = loss_fn(y, model(x, training=True))
        return reference, direct, tape.gradient(loss, variables)

    with rewritten(calls=2) as log:
        reference, direct, taped = step(x, y)
    assert max_relative_error(reference, direct) <= 1e-5
    assert max_relative_error(reference, taped) <= 1e-5
    details = log.entries[-1].plan.details
    assert details["predicted_bytes"] <= 0.6 * (1 - details["margin"]) * details["plain_bytes"]
    assert details["checkpoints"] > 0

    hooked = memgrad.enable_checkpointing(
        keras.models.clone_model(model), checkpoints=memgrad.strategies.Budget(0.6))
    hooked.set_weights(model.get_weights())
    hooked.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    target = tf.zeros((x.shape[0], 10))
    model.fit(x, target, batch_size=x.shape[0], epochs=1, verbose=0)
    with rewritten():
        hooked.fit(x, target, batch_size=x.shape[0], epochs=1, verbose=0)
    # One SGD step of 0.1: the weights inherit the gradients' 1e-5 relative error times
    # 0.1 |g| (2.7e-6 on one weight of 1,024 with the measured Budget's plan).
    for a, b in zip(model.get_weights(), hooked.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _wide_weights_convnet():
    """Conv -> BN -> ReLU blocks and a wide Dense head (random init): the weights' gradients
    (about 8 MiB) outweigh the activations (about 3 MiB), as in VGG16 or ResNet50 at small
    inputs."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 8))
    h = inputs
    for filters in (32, 64, 128, 256):
        h = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(h)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.ReLU()(h)
        h = keras.layers.MaxPooling2D()(h) if filters < 256 else h
    h = keras.layers.Dense(1024, activation="relu")(keras.layers.Flatten()(h))
    return keras.Model(inputs, keras.layers.Dense(10)(h))


def test_the_models_peaks_follow_grapplers_simulation_where_weights_gradients_dominate():
    """The model counts the weights' gradients made by each backward position, held to the
    end. It used to count none in the last segment: plain backprop at 0.47-0.52 of the
    simulated peak on ResNet50, VGG16 and InceptionV3 (keras.applications), and 'memory'
    plans predicted above plain's peak. (A step that consumes each gradient as it is made,
    `hold_gradients=False`, is modelled as holding them: Grappler's schedule keeps them
    alive most of the way.)"""
    from memgrad._src.checkpointing.budget_measure import peak_of, plain_gradients
    from memgrad._src.checkpointing.plans import memory_plan

    model, out = _wide_weights_convnet(), {}

    @tf.function
    def trace(x):
        loss = tf.reduce_mean(tf.square(model(x, training=True)))
        view = ForwardGraph([loss], model.trainable_variables)
        m, kept = MemoryModel(view), memory_plan(view).tensors
        out["modelled"] = m.predict([])[0], m.predict(m.positions_of(kept))[0]
        memory = memgrad.gradients(loss, model.trainable_variables, checkpoints=kept)
        out["simulated"] = tuple(peak_of(view, grads, None, True).bytes
                                 for grads in (plain_gradients(view), memory))  # held
        return loss

    trace.get_concrete_function(tf.TensorSpec([32, 16, 16, 8]))
    (plain, memory), (plain_sim, memory_sim) = out["modelled"], out["simulated"]
    print(f"plain {plain / MiB:.2f} vs {plain_sim / MiB:.2f} MiB simulated, "
          f"'memory' {memory / MiB:.2f} vs {memory_sim / MiB:.2f}")
    # Grappler's simulation is deterministic (no run, no thread order).
    assert plain == pytest.approx(plain_sim, rel=0.1)
    assert memory == pytest.approx(memory_sim, rel=0.15)


def test_a_constant_factors_gradient_is_not_counted_as_reading_the_activation():
    """``x * 0.5``: TensorFlow's Mul gradient reads ``x`` only for the constant's gradient,
    which nothing uses and TensorFlow prunes before the function runs. Counting it put
    GPT-2's plain backprop at 1.34x its simulated peak (tanh-approximated GELU, layer norm)."""
    @tf.function(autograph=False)
    def trace(x, w):
        m = x @ w
        return m * 0.5, m * x

    graph = trace.get_concrete_function(tf.TensorSpec([4, 4]), tf.TensorSpec([4, 4])).graph
    by_constant, by_tensor = [op for op in graph.get_operations() if op.type == "Mul"]
    if by_constant.inputs[1].op.type != "Const":
        by_constant, by_tensor = by_tensor, by_constant
    assert gradient_reads(by_constant, needed={0}) == ({1}, set())  # the constant only
    assert gradient_reads(by_constant) == ({0, 1}, set())  # every input's gradient
    assert gradient_reads(by_tensor, needed={0, 1}) == ({0, 1}, set())
    assert gradient_reads(by_tensor, needed={1}) == ({0}, set())


def test_the_models_plain_peak_follows_grapplers_simulation_on_a_gelu_mlp():
    """A tanh-approximated GELU (as GPT-2's) multiplies its input by constants at every step:
    the model counted each product's input as saved (22 MiB against 16 simulated here)."""
    from memgrad._src.checkpointing.budget_measure import peak_of, plain_gradients

    weights = [tf.Variable(tf.random.stateless_normal([256, 256], seed=[i, 0]) * 0.05)
               for i in range(6)]
    out = {}

    @tf.function
    def trace(x):
        h = x
        for w in weights:
            h = h + tf.nn.gelu(h @ w, approximate=True)
        loss = tf.reduce_mean(tf.square(h))
        view = ForwardGraph([loss], weights)
        out["modelled"] = MemoryModel(view).predict([])[0]
        out["simulated"] = peak_of(view, plain_gradients(view), None, True).bytes
        return loss

    trace.get_concrete_function(tf.TensorSpec([512, 256]))
    print(f"plain {out['modelled'] / MiB:.2f} vs {out['simulated'] / MiB:.2f} MiB simulated")
    assert out["modelled"] == pytest.approx(out["simulated"], rel=0.1)


def test_gradient_reads_follow_tensorflows_gradients():
    @tf.function(autograph=False)
    def trace(x, w):
        m = x @ w
        return tf.nn.relu(m), tf.tanh(m), m + x, m * x

    graph = trace.get_concrete_function(
        tf.TensorSpec([4, 4]), tf.TensorSpec([4, 4])).graph
    ops = {op.type: op for op in graph.get_operations()}
    assert gradient_reads(ops["MatMul"]) == ({0, 1}, set())
    assert gradient_reads(ops["Relu"]) == (set(), {0})
    assert gradient_reads(ops["Tanh"]) == (set(), {0})
    assert gradient_reads(ops["AddV2"]) == (set(), set())
    assert gradient_reads(ops["Mul"]) == ({0, 1}, set())


def test_analyze_reports_a_budget_curve():
    weights, loss_fn_, shape = WORKLOADS["uneven"](batch=1024)
    report = memgrad.analyze(loss_fn_, tf.TensorSpec(shape), budget_points=5)
    curve = report.curve
    assert len(curve) == 5
    assert report.plain_predicted_bytes > report.predicted_bytes > 0
    for point in curve:
        assert point.predicted_bytes is not None
        assert point.predicted_bytes <= point.budget_bytes * (1 + 1e-9)
    extra = [p.extra_compute for p in curve]
    assert extra[-1] == 0.0  # plain backprop's peak: nothing recomputed
    assert all(a >= b for a, b in zip(extra, extra[1:])), extra  # more memory, less work
    assert "budget curve" in report.summary()


def test_budget_curve_accepts_budgets():
    view, model = _model("tanh_chain")
    plain = model.predict([])[0]
    curve = budget_curve(view, budgets=[0.01 * plain, 0.5 * plain], model=model)
    assert curve[0].predicted_bytes is None  # too small: no plan
    assert curve[1].predicted_bytes <= 0.5 * plain


def test_prefixes_of_a_plan_run_from_one_cut_to_all_but_one():
    from memgrad._src.checkpointing.budget_planner import _prefixes

    cuts = [3, 8, 13, 21, 34, 55, 89, 144, 233, 377]
    prefixes = _prefixes(cuts)
    assert 1 <= len(prefixes) <= 8
    assert all(p == cuts[:len(p)] for p in prefixes)
    lengths = [len(p) for p in prefixes]
    assert lengths == sorted(set(lengths)) and lengths[0] == 1 and lengths[-1] == 9
    assert _prefixes([5]) == [] and _prefixes([]) == [] and _prefixes(None) == []
    assert _prefixes([2, 7]) == [[2]]


@pytest.mark.parametrize("peaks, target, found", [
    ([9, 8, 7, 6, 5, 4, 3, 2, 1], 6.5, 3),      # the cheapest that fits, in the middle
    ([9, 8, 7, 6, 5, 4, 3, 2, 1], 10, 0),       # the cheapest of all fits
    ([9, 8, 7, 6, 5, 4, 3, 2, 1], 1, 8),        # only the leanest fits
    ([9, 8, 7, 6, 5, 4, 3, 2, 1.5], 1, None),   # none fits: refused
])
def test_a_bisection_finds_the_cheapest_candidate_that_fits_in_few_measurements(
        monkeypatch, peaks, target, found):
    """Where the memory model puts every candidate too far over the target, the Budget
    bisects the candidates (ordered by recomputation) by their measured peaks."""
    from memgrad._src.checkpointing import budget as budget_module

    class FakePlan:
        def __init__(self, index, walk=None):
            self.details, self.walk = {"candidate": index}, walk

    monkeypatch.setattr(budget_module.Budget, "_plan_for",
                        lambda self, view, walk, cuts, peak, cost, index: FakePlan(index, walk))
    walk = BudgetWalk(planner=None, scale=1.0, plain_bytes=10.0, budget_bytes=max(target, peaks[-1]) * 1.2,
                      target_bytes=target, start=0.0, candidates=tuple((i, peak, [i]) for i, peak in enumerate(peaks)),
                      search=(0, len(peaks)))
    strategy = budget_module.Budget(0.5)
    plan, measured, kept = FakePlan((len(peaks) - 1) // 2), [], None
    while plan is not None:
        index = plan.details["candidate"]
        walk = plan.walk or walk  # each step of the walk is a new walk
        if index in walk.peak_by_candidate:  # rebuilt with its peak known: kept
            kept = index
            break
        measured.append(index)
        walk = walk.with_peak(index, peaks[index])
        try:
            following = strategy._bisect(None, walk, plan, peaks[index] <= target)
        except memgrad.BudgetError:
            assert found is None
            break
        kept = index if following is None else kept
        plan = following
    assert len(measured) <= 4, measured  # ceil(log2(9)) = 4
    if found is not None:
        assert kept == found, (measured, kept)


def test_the_models_own_plan_measured_over_the_target_is_refined_once(monkeypatch):
    """The model's own plan for the target measured 10% over it: the model's plan for a
    target 10% lower (and 1%) is tried next, before the fixed candidates after it; once."""
    from memgrad._src.checkpointing import budget as budget_module

    class FakePlan:
        def __init__(self, index):
            self.details = {"candidate": index}

    asked = []

    class FakePlanner:
        class model:
            predict = staticmethod(lambda cuts: (80.0, 2.5))

        def solve(self, budget):
            asked.append(budget)
            return [4, 8]

    monkeypatch.setattr(budget_module.Budget, "_plan_for",
                        lambda self, view, walk, cuts, peak, cost, index: FakePlan(index))
    first = BudgetWalk(planner=FakePlanner(), scale=1.0, plain_bytes=200.0, budget_bytes=105.0,
                       target_bytes=100.0, start=0.0, order=(1, 2, 0), own=(100.0, [5]),
                       candidates=((1.0, 120.0, [2]), (2.0, 100.0, [5]), (3.0, 70.0, [3, 7])))
    strategy = budget_module.Budget(0.5)
    following, walk = strategy._refined(None, first, FakePlan(1), peak=110.0)
    assert asked == [pytest.approx(100.0 * 100.0 / 110.0 * 0.99)]
    assert following.details["candidate"] == 3 and walk.candidates[3] == (2.5, 80.0, [4, 8])
    assert walk.order == (1, 3, 2, 0)
    assert first.order == (1, 2, 0) and len(first.candidates) == 3  # the walk a plan held is unchanged
    assert strategy._refined(None, walk, FakePlan(1), peak=110.0) == (None, walk)  # once per walk
    assert strategy._refined(None, first, FakePlan(2), peak=110.0) == (None, first)  # not the own plan


def test_a_candidate_measured_over_the_target_rescales_the_model_for_the_next():
    """A candidate measured 30% over its scaled model peak: the candidates after it that the
    rescaled model still puts over the target go to the end of the order, and the next one
    tried is the cheapest predicted to fit; every candidate is still tried before none is
    left."""
    # (cost, model peak, cuts): scaled model peaks 100, 96, 90, 80, 70, 60.
    walk = BudgetWalk(planner=None, scale=2.0, plain_bytes=400.0, budget_bytes=105.0, target_bytes=100.0,
                      start=0.0, order=(1, 2, 3, 4, 5, 0),
                      candidates=tuple((i, peak, [i]) for i, peak in enumerate([50, 48, 45, 40, 35, 30])))
    # Candidate 1 (model 96) measured 124.8: ratio 1.3; 90*1.3 > 100, 80*1.3 > 100, 70*1.3 <= 100.
    index, walk = next_candidate(walk, 1, 124.8)
    assert index == 4 and walk.order == (1, 4, 5, 0, 2, 3)
    # Candidate 4 (model 70) measured 105 (ratio 1.5): 60 * 1.5 = 90 fits, so 5 is next.
    index, walk = next_candidate(walk, 4, 105.0)
    assert index == 5 and walk.order == (1, 4, 5, 0, 2, 3)
    # Candidate 5 (model 60) measured 200: nothing is predicted to fit, the next in order;
    # after the last, none.
    assert next_candidate(walk, 5, 200.0)[0] == 0
    assert next_candidate(walk, 3, 200.0) == (None, walk)


def test_a_measurement_under_the_model_keeps_the_order():
    walk = BudgetWalk(planner=None, scale=1.0, plain_bytes=200.0, budget_bytes=105.0, target_bytes=100.0,
                      start=0.0, order=(1, 2, 3, 0),
                      candidates=((0, 120.0, [0]), (1, 99.0, [1]), (2, 90.0, [2]), (3, 80.0, [3])))
    # Candidate 1 modelled 99, measured 101 (ratio ~1.02): 90 * 1.02 fits: next is 2.
    assert next_candidate(walk, 1, 101.0) == (2, walk)


def test_a_candidate_over_the_target_is_passed_over_and_none_fitting_is_refused(monkeypatch):
    """A candidate whose simulated peak is over the target is not taken; when no candidate's
    fits the target, the error names the least peak plus the margin (even where that peak
    is within the budget itself)."""
    from memgrad._src.checkpointing import budget as budget_module
    from memgrad._src.checkpointing.budget_measure import Peak

    class FakePlan:
        def __init__(self, index, walk):
            self.details = {"candidate": index, "target_bytes": walk.target_bytes, "predicted_bytes": 0.0}
            self.strategy_state = walk

    runs = {0: Peak(108.0, "simulated"), 1: Peak(112.0, "simulated")}
    simulating = []
    monkeypatch.setattr(budget_module, "peak_of", lambda view, grads, kernels, hold: runs[simulating[-1]])
    monkeypatch.setattr(budget_module.Budget, "_plan_for",
                        lambda self, view, walk, cuts, peak, cost, index: FakePlan(index, walk))
    walk = BudgetWalk(planner=None, scale=1.0, plain_bytes=200.0, budget_bytes=110.0, target_bytes=88.0,
                      start=0.0, source="simulated", margin=0.2, order=(0, 1),
                      candidates=((0, 90.0, [0]), (1, 85.0, [1])))
    strategy = budget_module.Budget(110)

    def refine(plan):
        simulating.append(plan.details["candidate"])
        return strategy.refine(None, plan, None)

    following = refine(FakePlan(0, walk))
    assert following.details["candidate"] == 1  # 0's peak (108) is over the target
    assert following.strategy_state.peak_by_candidate == {0: 108.0} and walk.peaks == ()
    with pytest.raises(memgrad.BudgetError, match=r"at least 135 B"):  # 108 / 0.8
        refine(following)


def test_plain_backprops_simulated_peak_is_the_scale(monkeypatch):
    """Plain backprop simulates at 108 bytes (every plan "simulates" at 108 here): a
    fraction is of 108, so Budget(1.0) and a budget of 108 bytes are plain backprop, and a
    budget of 100 bytes is not (nor is any candidate: they simulate at 108 too)."""
    from memgrad._src.checkpointing import budget as budget_module
    from memgrad._src.checkpointing.budget_measure import Peak

    monkeypatch.setattr(budget_module, "peak_of", lambda view, grads, kernels, hold: Peak(108.0, "simulated"))
    step, *_ = _tanh_chain_tracer()
    for limit in (1.0, 108):
        with memgrad.record_rewrites() as log:
            step(memgrad.strategies.Budget(limit, simulate=True))
        details = log[-1].plan.details
        assert details["plain_bytes"] == 108.0 and details["scale_source"] == "simulated"
        assert details["budget_bytes"] == 108.0 and details["same_as_plain"] is True
    with pytest.raises(memgrad.BudgetError, match=r"at least 135 B: .* plain backprop's simulated peak is 108 B"):
        step(memgrad.strategies.Budget(100, simulate=True))  # 108 with the 20% margin
