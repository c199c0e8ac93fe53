"""Made the .keras files in this folder with memgrad 0.1 at commit 2a9ab58, before the current layout
(zoo imported as `models`, implementation under memgrad.checkpointing etc.). Kept for reference;
it runs only against that layout. tests/test_saved_files.py checks they still load."""
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, os.getcwd())
import numpy as np, keras, tensorflow as tf
import memgrad
from models import densenet
from models.glow import Glow

out = "tests/data"
x = tf.random.stateless_uniform([2, 8, 8, 1], seed=[3, 4])
ref = {"images": x.numpy()}
keras.utils.set_random_seed(0)
ri = keras.Input((8, 8, 2))
rs = memgrad.layers.ReversibleSequence([memgrad.layers.AdditiveCoupling(keras.layers.Conv2D(1, 3, padding="same"), keras.layers.Conv2D(1, 3, padding="same")), memgrad.layers.AffineCoupling(network=keras.layers.Conv2D(2, 3, padding="same")), memgrad.layers.ActNorm(), memgrad.layers.Invertible1x1Conv()])
m = keras.Model(ri, rs(ri)); xr = tf.concat([x, x * 0.5], -1); m(xr); m.save(f"{out}/reversible_v0_1.keras"); ref["reversible"] = m(xr, training=False).numpy()
m = densenet.densenet_bc(16, 6, efficient=True, input_shape=(8, 8, 1)); m.save(f"{out}/densenet16_v0_1.keras"); ref["densenet"] = m(x, training=False).numpy()
g = Glow((8, 8, 1), levels=2, steps=2, hidden=8, reversible=True, seed=4); g(x); g.save(f"{out}/glow_v0_1.keras")
ref["glow_logdet"] = g.encode(x)[1].numpy()
inp = keras.Input((8, 8, 1))
h = memgrad.layers.Conv2D(4, 3, padding="same")(inp)
h = memgrad.layers.BatchNormalization()(h)
h = memgrad.layers.ReLU()(h)
h = memgrad.layers.Checkpoint()(h)
h = memgrad.layers.MaxPooling2D()(h)
h = memgrad.layers.ReversibleSequence([memgrad.layers.AdditiveCoupling(keras.layers.Dense(2), keras.layers.Dense(2)), memgrad.layers.AffineCoupling(keras.layers.Dense(4))])(h) if False else h
h = keras.layers.Flatten()(h)
h = memgrad.layers.Dense(3)(h)
s = keras.Model(inp, h); s.save(f"{out}/selective_v0_1.keras"); ref["selective"] = s(x, training=False).numpy()
np.savez(f"{out}/v0_1_outputs.npz", **ref)
print({k: v.shape for k, v in ref.items()})
