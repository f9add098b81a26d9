"""Serialization in one process: frames, out-of-band buffers, tensors, the restricted unpickler."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import pickle

import numpy as np
import pytest
import torch

import hwdist
from hwdist import _compat
from hwdist import serialization as ser
from hwdist.serialization import frames, tensors
from hwdist.serialization.restricted import loader as _restricted
from tests.programs import torch_kinds


def _roundtrip(obj, serializer=None, map_location=None):
    frame = ser.encode(obj, serializer)
    data = frame.to_numpy()
    assert data.size == frame.nbytes and frame.nbytes % frames.ALIGN == 0
    return ser.decode(data, 0, serializer, map_location), frame, data


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.int16,
    ],
)
def test_tensors_roundtrip_every_dtype_and_layout(dtype):
    base = (torch.arange(24) % 7).to(dtype).reshape(2, 3, 4)
    for t in (
        base,
        base.transpose(0, 2),
        base[:, 1],
        base.reshape(-1)[0],
        base[:0],
        base.clone().requires_grad_(dtype.is_floating_point),
    ):
        back, _, _ = _roundtrip({"t": t})
        got = back["t"]
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t.detach())
        assert got.requires_grad == t.requires_grad and got.device.type == "cpu"


@pytest.mark.parametrize("restricted", [False, True])
def test_tensors_with_conj_or_neg_bits_and_small_ones_come_back_exact_and_owned(restricted):
    c = torch.complex(torch.arange(6.0), torch.arange(6.0) + 10)
    neg = c.conj().imag  # a view with the neg bit set
    assert c.conj().is_conj() and neg.is_neg()
    small = torch.arange(40, dtype=torch.int64).reshape(5, 8)
    cases = {
        "conj": c.conj(),
        "neg": neg,
        "0-d int": torch.tensor(5),
        "column": small[:, 3],
        "bf16 strided": small.to(torch.bfloat16)[:, ::3],
        "grad": torch.ones(3, requires_grad=True),
    }
    serializer = ser.RestrictedPickleSerializer() if restricted else ser.PickleSerializer()
    back, _, _ = _roundtrip(cases, serializer)
    for name, t in cases.items():
        got = back[name]
        assert got.dtype == t.dtype and got.shape == t.shape, name
        assert torch.equal(got.resolve_conj().resolve_neg(), t.detach().resolve_conj().resolve_neg()), name
        assert not got.is_conj() and not got.is_neg() and got.requires_grad == t.requires_grad, name
    back["column"][0] = -1  # the result owns its memory
    assert small[0, 3] == 3


def test_large_buffers_travel_out_of_band_and_alias_the_frame():
    arr = np.arange(100_000, dtype=np.float64)
    t = torch.arange(50_000, dtype=torch.float32)
    back, frame, data = _roundtrip({"arr": arr, "t": t, "small": np.arange(3)})
    assert len(frame.buffers) == 2  # the small array stayed in band
    assert frame.stream.nbytes < 4096  # the big data is not in the pickle stream
    assert np.array_equal(back["arr"], arr) and torch.equal(back["t"], t)
    # zero copy on the receiving side: the array's memory lies inside the frame, and is writable
    lo, hi = data.ctypes.data, data.ctypes.data + data.size
    assert lo <= back["arr"].ctypes.data < hi and back["arr"].flags.writeable
    assert lo <= back["t"].data_ptr() < hi


def test_numpy_variants_and_stdlib_types():
    objs = [
        np.float64(1.5),
        np.int32(3),
        np.array([1, "a"], dtype=object),
        np.arange(6).reshape(2, 3)[:, ::2],
        np.zeros(3, dtype=[("a", "i4"), ("b", "f8")]),
        collections.OrderedDict(a=1),
        {1, 2},
        frozenset({3}),
        b"bytes",
        bytearray(b"ba"),
        1 + 2j,
        datetime.date(2024, 1, 2),
        None,
        (1, [2, {"x": None}]),
    ]
    back, _, _ = _roundtrip(objs, ser.RestrictedPickleSerializer())
    for a, b in zip(objs, back):
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and (a == b).all()
        else:
            assert a == b and type(a) is type(b)


_SMALL_1D_DTYPES = ["?", "i1", "u1", "<i2", ">i4", "<u8", "<f2", "<f4", ">f8", "<c8", ">c16"]


@pytest.mark.parametrize("restricted", [False, True])
@pytest.mark.parametrize("dtype", _SMALL_1D_DTYPES)
def test_small_1d_arrays_travel_as_frombuffer_and_come_back_exact_and_writable(dtype, restricted):
    full = (np.arange(74) % 5).astype(dtype)
    ro = full[:37].copy()
    ro.setflags(write=False)
    serializer = ser.RestrictedPickleSerializer() if restricted else ser.PickleSerializer()
    for src in (full[:37], full[::2], full.reshape(2, 37)[:, 3], ro):  # dense, strided, column, read-only
        before = src.copy()
        back, frame, _ = _roundtrip({"pred": src}, serializer)
        got = back["pred"]
        assert b"frombuffer" in bytes(frame.stream)  # the fast form was used
        assert got.dtype == src.dtype and got.shape == src.shape and np.array_equal(got, src)
        assert got.flags.writeable and not np.shares_memory(got, src)
        got[0] = got[1]  # writable and owned: the source does not change
        assert np.array_equal(src, before)


@pytest.mark.parametrize("restricted", [False, True])
def test_arrays_outside_the_fast_form_keep_numpys_forms(restricted):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    cases = {
        "0-d": np.array(3.5),
        "2-d": base,
        "fortran": np.asfortranarray(base),
        "2-d strided": base[:, ::2],
        "empty": np.zeros(0, dtype=np.int16),
        "record": np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]),
        "datetime": np.array(["2024-01-02"], dtype="datetime64[D]"),
    }
    if restricted:
        del cases["datetime"]  # not a plain dtype: the restricted loader refuses it in any form
    serializer = ser.RestrictedPickleSerializer() if restricted else ser.PickleSerializer()
    back, frame, _ = _roundtrip(cases, serializer)
    assert b"frombuffer" not in bytes(frame.stream)
    for name, a in cases.items():
        got = back[name]
        assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a), name
    assert back["2-d"].flags.writeable and back["fortran"].flags.f_contiguous


class _Forged:
    """A peer's stream calling numpy.frombuffer with arguments hwdist never sends."""

    def __init__(self, *args) -> None:
        self.args = args

    def __reduce__(self):
        return (np.frombuffer, self.args)


@pytest.mark.parametrize(
    "args, match",
    [
        ((b"abc", np.dtype("<f4")), "not a whole, non-empty number"),
        ((b"", np.dtype("<f4")), "not a whole, non-empty number"),
        ((b"\x00\x02", np.dtype("?")), "bool buffer"),
        ((b"abcd", np.dtype([("a", "<i4")])), "plain numeric dtype"),
        ((b"abcd", "f4"), "plain numeric dtype"),
        (("abcd", np.dtype("<f4")), "expected a buffer"),
        ((b"abcd", np.dtype("<f4"), 1), "numpy.frombuffer"),
    ],
)
def test_restricted_frombuffer_refuses_what_hwdist_never_sends(args, match):
    stream = pickle.dumps(_Forged(*args), protocol=5)
    with pytest.raises(hwdist.UnpicklingRefused, match=match):
        ser.RestrictedPickleSerializer().loads(memoryview(stream), [])


@pytest.mark.parametrize("enabled", [True, False])
def test_decoding_pauses_the_garbage_collector_and_restores_it(enabled):
    import gc

    seen = []

    class Spy(ser.PickleSerializer):
        def loads(self, stream, buffers):
            seen.append(gc.isenabled())
            return super().loads(stream, buffers)

    frame = ser.encode([{"i": i} for i in range(10)]).to_numpy()
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        assert ser.decode(frame, 0, Spy())[3] == {"i": 3}
        assert gc.isenabled() is enabled and seen == [False]
        with pytest.raises(ValueError):  # a failing decode restores it too
            ser.decode(frame[:100], 0, Spy())
        bad = frame.copy()
        bad[64:] = 0  # a frame whose pickle stream is garbage
        with pytest.raises(pickle.UnpicklingError):
            ser.decode(bad, 0, Spy())
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_map_location_and_shared_references():
    t = torch.ones(3)
    back, _, _ = _roundtrip([t, t], map_location="meta")
    assert back[0].device.type == "meta" and back[0] is back[1]
    want = "map_location must be a torch.device, a device string or None, got 'x'"
    with pytest.raises(ValueError, match=want):
        _roundtrip(t, map_location="x")


def test_object_to_tensor_roundtrip_with_padding_and_no_aliasing():
    t = hwdist.object_to_tensor({"a": np.arange(100_000)})
    assert t.dtype == torch.uint8 and t.dim() == 1 and t.device.type == "cpu"
    padded = torch.cat([t, torch.zeros(13, dtype=torch.uint8)])
    obj = hwdist.tensor_to_object(padded)
    padded.zero_()  # the result owns its bytes
    assert obj["a"][-1] == 99_999
    assert hwdist.obj2tensor is hwdist.object_to_tensor and hwdist.tensor2obj is hwdist.tensor_to_object
    with pytest.raises(TypeError, match="expected a uint8 tensor"):
        hwdist.tensor_to_object(torch.zeros(3))
    with pytest.raises(ValueError, match="not an hwdist object payload: expected a frame header"):
        hwdist.tensor_to_object(torch.zeros(64, dtype=torch.uint8))


class _Writes:
    """Unpickling this would create a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


class _Plain:
    def __init__(self) -> None:
        self.x = 1


@dataclasses.dataclass
class _Box:
    value: int


def test_restricted_unpickler_refuses_unknown_globals_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    rs = ser.RestrictedPickleSerializer()
    for evil in (_Writes(str(marker)), [1, {"k": _Writes(str(marker))}]):
        data = ser.encode(evil).to_numpy()
        with pytest.raises(ser.UnpicklingRefused, match="io.open"):
            ser.decode(data, serializer=rs)
    assert not marker.exists()
    # plain pickle data naming a dangerous callable is refused by restricted_loads too
    payload = pickle.dumps(_Writes(str(marker)))
    with pytest.raises(hwdist.UnpicklingRefused):
        hwdist.restricted_loads(payload)
    with pytest.raises(hwdist.UnpicklingRefused, match="_Plain"):
        ser.decode(ser.encode(_Plain()).to_numpy(), serializer=rs)
    # torch's own tensor format (plain pickle of a tensor) goes through torch.load: refused
    with pytest.raises(hwdist.UnpicklingRefused, match="torch"):
        hwdist.restricted_loads(pickle.dumps(torch.ones(2)))
    assert not marker.exists()


def test_allow_list_can_be_extended():
    data = ser.encode(_Box(3)).to_numpy()
    with pytest.raises(hwdist.UnpicklingRefused):
        ser.decode(data, serializer=ser.RestrictedPickleSerializer())
    assert ser.decode(data, serializer=ser.RestrictedPickleSerializer(allow=[_Box])) == _Box(3)
    key = (_Box.__module__, _Box.__qualname__)
    assert key not in hwdist.safe_globals()
    hwdist.register_safe_class(_Box)
    try:
        assert key in hwdist.safe_globals()
        assert ser.decode(data, serializer=ser.RestrictedPickleSerializer()) == _Box(3)
    finally:
        _restricted.SAFE.discard(key)
    with pytest.raises(TypeError, match="register_safe_class"):
        hwdist.register_safe_class(3)
    with pytest.raises(ValueError, match="module.QualName"):
        hwdist.register_safe_class("nodot")


class _JsonSerializer(hwdist.Serializer):
    def dumps(self, obj):
        import json

        return json.dumps(obj).encode(), []

    def loads(self, stream, buffers):
        import json

        return json.loads(bytes(stream))


def test_pluggable_serializer():
    js = _JsonSerializer()
    back, frame, _ = _roundtrip({"a": [1, 2]}, js)
    assert back == {"a": [1, 2]} and frame.buffers == []
    assert hwdist.get_serializer() is not js
    with hwdist.use_serializer(js):
        assert hwdist.get_serializer() is js
        assert hwdist.tensor_to_object(hwdist.object_to_tensor([3])) == [3]
    assert isinstance(hwdist.get_serializer(), hwdist.PickleSerializer)
    with pytest.raises(TypeError, match="Serializer"):
        hwdist.set_serializer(object())  # type: ignore[arg-type]


# ---- what torch's weights_only=True loader accepts: module state, sparse, quantized, meta ----------

_KINDS = torch_kinds.everything(0)
_SERIALIZERS = {
    "pickle": ser.PickleSerializer,
    "restricted": ser.RestrictedPickleSerializer,
    "weights_only": ser.WeightsOnlySerializer,
}


@pytest.mark.parametrize("serializer", sorted(_SERIALIZERS))
def test_a_module_state_dict_roundtrips_with_its_metadata_and_loads_into_a_model(serializer):
    model = torch_kinds.model(3)
    state = model.state_dict()
    assert state._metadata  # what made the restricted loader refuse it: BUILD on an OrderedDict
    back, _, _ = _roundtrip(state, _SERIALIZERS[serializer]())
    assert type(back) is collections.OrderedDict and back._metadata == state._metadata
    assert torch_kinds.same(state, back) and not torch_kinds.same(state, torch_kinds.model(4).state_dict())
    fresh = torch_kinds.model(5)
    fresh.load_state_dict(back)  # strict: every key, and the versions in _metadata
    x = torch.randn(6, 3)
    assert torch.equal(fresh.eval()(x), model.eval()(x))


@pytest.mark.parametrize("serializer", sorted(_SERIALIZERS))
@pytest.mark.parametrize("kind", sorted(k for k in _KINDS if k != "state_dict"))
def test_sparse_quantized_and_meta_tensors_roundtrip(kind, serializer):
    t = _KINDS[kind]
    back, _, _ = _roundtrip({"t": t}, _SERIALIZERS[serializer]())
    assert torch_kinds.same(t, back["t"]), (kind, back["t"])


def test_torchs_own_weights_only_loader_accepts_the_same_kinds():
    """The reference: torch.load(weights_only=True) reads a state_dict, sparse and meta tensors on every
    torch hwdist supports, and quantized tensors from torch 2.4 (2.1 refuses _rebuild_qtensor)."""
    import io

    names = [k for k in _KINDS if not k.startswith("per_") or _compat.TORCH_VERSION >= (2, 4)]
    buf = io.BytesIO()
    torch.save({k: _KINDS[k] for k in names}, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    for k in names:  # torch drops requires_grad of a sparse tensor; hwdist keeps it, as for a dense one
        want = _KINDS[k].detach() if k == "coo_requires_grad" else _KINDS[k]
        assert torch_kinds.same(want, back[k]), k


class _Call:
    """A stream that calls ``fn(*args)``, pickled by hwdist's pickler (tensors inside in hwdist's form)."""

    def __init__(self, fn, *args) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


class _StateOf(collections.OrderedDict):
    """An OrderedDict whose pickle sets ``state`` with BUILD (as a state_dict's ``_metadata``)."""

    def __init__(self, state) -> None:
        super().__init__()
        self.state = state

    def __reduce__(self):
        return (collections.OrderedDict, (), self.state, None, iter(self.items()))


_IDX = torch.tensor([[0, 1]])
_Q = torch.tensor([1, 2, 3], dtype=torch.uint8)
_F64 = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
_ONE, _TWO = torch.ones(1), torch.ones(2)


def _sparse(layout, parts, shape, coalesced=False, requires_grad=False):
    return _Call(tensors.rebuild_sparse, layout, parts, shape, coalesced, requires_grad)


def _quantized(values, *params):
    return _Call(tensors.rebuild_quantized, values, params)


@pytest.mark.parametrize(
    "obj, match",
    [
        (_sparse("sparse_coo", (torch.tensor([[5]]), _ONE), (2,)), "size is inconsistent with indices"),
        (_sparse("sparse_coo", (torch.tensor([[0, 0]]), _TWO), (2,), coalesced=True), "uncoalesced"),
        (_sparse("sparse_csr", (torch.tensor([0, 5]), torch.tensor([0]), _ONE), (1, 2)), "crow_indices"),
        (_sparse("strided", (_IDX, _TWO), (2,)), "layout 'strided'"),
        (_sparse("sparse_coo", (_IDX.float(), _TWO), (2,)), "int64 or int32"),
        (_sparse("sparse_coo", (_IDX, _TWO.long()), (2,), requires_grad=True), "requires_grad"),
        (_quantized(_Q, "per_tensor_affine", -0.5, 0), "finite and positive"),
        (_quantized(_Q, "per_tensor_affine", float("nan"), 0), "finite and positive"),
        (_quantized(_Q.float(), "per_tensor_affine", 0.5, 0), "uint8, int8 or int32"),
        (_quantized(_Q, "per_tensor_symmetric", 0.5, 0), "the scheme must be one of"),
        (_quantized(_Q, "per_channel_affine", _F64[:2], _IDX[0], 0), "one per entry of the axis"),
        (_quantized(_Q, "per_channel_affine", _F64, torch.tensor([0, 0, 0]), 1), "one per entry of the axis"),
        (_quantized(_Q, "per_channel_affine", _F64, torch.tensor([0.0, 0, 0]), 0), "int64 zero points"),
        (_StateOf({1: "not a str key"}), "must be a dict with str keys"),
        (_StateOf([("_metadata", {})]), "must be a dict with str keys"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_the_restricted_loader_refuses_what_torch_refuses_or_never_sends(obj, match):
    """Forged streams: indices out of the shape, a false coalesced claim, a scheme torch cannot rebuild..."""
    stream, buffers = ser.PickleSerializer(oob_threshold=1 << 30).dumps(obj)
    with pytest.raises(hwdist.UnpicklingRefused, match=match):
        ser.RestrictedPickleSerializer().loads(memoryview(stream), buffers)


def test_state_on_a_dict_or_counter_stays_refused():
    """torch's loader sets attributes on an OrderedDict only; so does the restricted loader."""

    class _StateOfDict(dict):
        def __reduce__(self):
            return (dict, (), {"_metadata": {}}, None, iter(self.items()))

    stream, _ = ser.PickleSerializer().dumps(_StateOfDict(a=1))
    with pytest.raises(hwdist.UnpicklingRefused, match="setting state on a 'builtins.dict'"):
        ser.RestrictedPickleSerializer().loads(memoryview(stream), [])
