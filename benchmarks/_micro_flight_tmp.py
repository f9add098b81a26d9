import timeit, torch, torch.distributed as d, sys, threading, time
import hwdist
from hwdist import flight, _compat
from hwdist.flight import recorder as R
from hwdist.collectives import _calls
from hwdist.collectives._calls import collective
d.init_process_group("gloo", store=d.HashStore(), rank=0, world_size=1)
@collective(0)
def e(group=None): pass
t = torch.ones(1)
@collective(1)
def e2(x, group=None): pass
e()
def run(label, stmt):
    best = min(timeit.repeat(stmt, globals=globals(), number=50000, repeat=9))/50000*1e6
    print(f"{label}: {best:.3f} us")
    return best
class Null:
    def begin(self, op, group, args, kwargs): return None
    def end(self, tok, err): pass
flight.enable(False); a=run("off", "e2(t)")
flight.enable(True); b=run("on", "e2(t)")
_calls.set_recorder(Null()); c=run("null recorder", "e2(t)")
flight.enable(True)
run("default_group", "_compat.default_group()")
run("summary", "R._summary(t)")
run("list11", "[1,2,3,4,5,6,7,8,9,10,11]")
print("recorder cost on-off", b-a, "path cost null-off", c-a)
rec = flight._recorder
orig_end = R.Recorder.end
R.Recorder.end = lambda self, tok, err: None
run("begin only", "e2(t)")
R.Recorder.end = orig_end
import weakref
run("weakref", "weakref.ref(t)")
def beg():
    return rec.begin("x", None, (t,), {})
run("begin direct", "beg()")
run("time", "time.time()")
run("getframe walk", "sys._getframe(0).f_code.co_filename.startswith('/work/wt/recorder/hwdist/')")
