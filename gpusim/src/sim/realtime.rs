//! Real-time clock for a [`PhysGpu`]: a thread that calls `advance` with the
//! monotonic clock and sleeps until the next deadline or a kick.

use crate::backend::{GpuEvent, Nanos, PhysGpu};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

struct State<G> {
    gpu: G,
    stop: bool,
    kicked: bool,
}

struct Shared<G> {
    st: Mutex<State<G>>,
    cv: Condvar,
    epoch: Instant,
}

/// Runs a GPU model against real time. Events go to the sink closure (called on
/// the driver thread, outside the lock), stamped with their modelled time.
pub struct RealTimeDriver<G: PhysGpu + 'static> {
    shared: Arc<Shared<G>>,
    thread: Option<JoinHandle<()>>,
}

impl<G: PhysGpu + 'static> RealTimeDriver<G> {
    /// Start the driver thread. Model time 0 = this call.
    pub fn start(gpu: G, mut sink: impl FnMut(GpuEvent) + Send + 'static) -> Self {
        let shared = Arc::new(Shared {
            st: Mutex::new(State {
                gpu,
                stop: false,
                kicked: false,
            }),
            cv: Condvar::new(),
            epoch: Instant::now(),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("gpu-sim".into())
            .spawn(move || {
                let mut buf = Vec::new();
                loop {
                    let mut st = sh.st.lock().unwrap_or_else(|e| e.into_inner());
                    if st.stop {
                        break;
                    }
                    let now = sh.epoch.elapsed().as_nanos() as Nanos;
                    st.gpu.advance(now, &mut buf);
                    let dl = st.gpu.next_deadline();
                    st.kicked = false;
                    if !buf.is_empty() {
                        drop(st);
                        for e in buf.drain(..) {
                            sink(e);
                        }
                        continue;
                    }
                    let now = sh.epoch.elapsed().as_nanos() as Nanos;
                    match dl {
                        Some(t) if t <= now => {
                            // Behind (e.g. over the model's event budget):
                            // let callers of `with` in before catching up.
                            drop(st);
                            std::thread::yield_now();
                            continue;
                        }
                        Some(t) => {
                            drop(sh.cv.wait_timeout_while(
                                st,
                                Duration::from_nanos(t - now),
                                |s| !s.kicked && !s.stop,
                            ));
                        }
                        None => {
                            drop(sh.cv.wait_while(st, |s| !s.kicked && !s.stop));
                        }
                    }
                }
            })
            .expect("spawn gpu-sim thread");
        RealTimeDriver {
            shared,
            thread: Some(thread),
        }
    }

    /// The instant that is model time 0.
    pub fn epoch(&self) -> Instant {
        self.shared.epoch
    }

    /// Model time now.
    pub fn now(&self) -> Nanos {
        self.shared.epoch.elapsed().as_nanos() as Nanos
    }

    /// Call `f(gpu, now)` under the lock (map, unmap, doorbell, query), then wake
    /// the driver so it re-plans its sleep.
    pub fn with<R>(&self, f: impl FnOnce(&mut G, Nanos) -> R) -> R {
        let mut st = self.shared.st.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.now();
        let r = f(&mut st.gpu, now);
        st.kicked = true;
        drop(st);
        self.shared.cv.notify_one();
        r
    }

    /// Stop the thread and return the model.
    pub fn stop(mut self) -> G {
        self.halt();
        let sh = self.shared.clone();
        drop(self);
        match Arc::try_unwrap(sh) {
            Ok(s) => s.st.into_inner().unwrap_or_else(|e| e.into_inner()).gpu,
            Err(_) => unreachable!("driver thread joined"),
        }
    }

    fn halt(&mut self) {
        {
            let mut st = self.shared.st.lock().unwrap_or_else(|e| e.into_inner());
            st.stop = true;
        }
        self.shared.cv.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<G: PhysGpu + 'static> Drop for RealTimeDriver<G> {
    fn drop(&mut self) {
        self.halt();
    }
}
