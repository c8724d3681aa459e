//! Guest images built from `guest-tools/` at compile time and embedded here.
//!
//! A fleet config names one as `image = "builtin:NAME"`. Every image also
//! carries a PVH entry note ([`elf::pvh_entry`]), so the file that
//! `hqdmux images --write` writes boots in Cloud Hypervisor and QEMU.

pub mod elf;

include!(concat!(env!("OUT_DIR"), "/builtin.rs"));

/// The ELF bytes of the built-in image `name`, if there is one.
pub fn builtin(name: &str) -> Option<&'static [u8]> {
    BUILTIN.iter().find(|(n, _)| *n == name).map(|(_, b)| *b)
}

/// Names of all built-in images, sorted.
pub fn names() -> impl Iterator<Item = &'static str> {
    BUILTIN.iter().map(|(n, _)| *n)
}

/// What a built-in image does and the arguments it reads (operator-facing
/// text for `hqdmux images`; the programs are in `guest-tools/src/bin/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    /// One sentence: what the guest does.
    pub summary: &'static str,
    /// Its `args` keys: (`key=VALUE`, meaning with default and range).
    pub args: &'static [(&'static str, &'static str)],
    /// What its exit statuses mean.
    pub exit: &'static str,
}

const INFO: &[(&str, ImageInfo)] = &[
    (
        "doorbell",
        ImageInfo {
            summary: "doorbell cost and detection probe for `vmm/examples/doorbell_bench.rs` \
                      (needs `gpu = true`): finds the vGPU on PCI, then times bare ioeventfd \
                      writes against vGPU doorbell writes, or rings high-priority jobs",
            args: &[
                ("bare=ADDR", "guest-physical address of the bench's bare ioeventfd (MMIO hole)"),
                ("n=N", "writes per round (default 5000)"),
                ("rounds=R", "rounds (default 5)"),
                (
                    "detect=J",
                    "instead: J jobs of one mark kernel, each doorbell right after checkpoint 2",
                ),
                ("wgs=W", "detect mode: workgroups per kernel (default 304)"),
                ("cost_us=C", "detect mode: simulated microseconds per workgroup (default 500)"),
            ],
            exit: "0 ok; 2 queue error; 3 no vGPU; 4 bad arguments or set-up",
        },
    ),
    (
        "fault",
        ImageInfo {
            summary: "misbehaving guest for tests: prints `fault: NAME mode MODE`, then \
                      faults, panics, hangs or exits as asked",
            args: &[
                (
                    "mode=MODE",
                    "triple (default): load an empty IDT and fault (outcome `triple fault`); \
                     panic: the guest panics; hang: spin forever (for run-timeout and \
                     signal tests); exit: exit with `code`",
                ),
                ("code=N", "exit status for mode=exit (default 1)"),
            ],
            exit: "mode=exit: `code`; mode=panic: 254 after a `guest panic: ...` line; the other modes do not exit",
        },
    ),
    (
        "gpu",
        ImageInfo {
            summary: "exercises the virtual GPU (needs `gpu = true` and enough RAM for one \
                      queue's CWSR area): creates AQL queues, submits mark kernels, rings \
                      each doorbell, waits for the completion signals and checks every \
                      workgroup counter is exactly 1; prints \
                      `gpu: Q queues x N kernels x W wgs[ x L loops]: ok`",
            args: &[
                ("queues=Q", "queues to create (default 1; at most the device's NUM_VHQD, 8 virtual HQDs here)"),
                ("kernels=N", "kernels per queue and cycle (default 4, 1..=65536)"),
                ("wgs=W", "workgroups per kernel (default 304, 1..=1048576)"),
                (
                    "cost_us=C",
                    "simulated GPU time per workgroup in microseconds (default 100, 0..=2^30)",
                ),
                (
                    "loops=L",
                    "repeat the submit/wait/verify cycle on the same queues (default 1, 1..=1048576)",
                ),
                ("priority=P", "queue priority inside the VM (default 7, 0..=15)"),
                ("verbose=1", "print the device geometry first (default 0)"),
                (
                    "bad=KIND",
                    "hostile-input tests: ring (queue 0's ring outside RAM), kernarg (a \
                     dispatch whose kernarg is outside RAM), wptr (write index past the \
                     ring), signal (a completion signal whose address wraps), mailbox \
                     (a signal whose event mailbox address wraps), hang (queue 0 also gets a \
                     kernel without a CWSR save point and 1-hour workgroups, then a SAVE \
                     dequeue: the host resets it after the VM's preempt_timeout_ms, error 22, \
                     `gpu: error interrupt`), stall (after the loops, queue 0 publishes a \
                     write index one past an INVALID slot and polls its read index `hold` \
                     times: it must not move), dbflood (after the loops, `hold` rings of \
                     queue 0's unchanged write index), wgflood (queue 0 also gets a kernel of \
                     2^31 one-ns workgroups); stall, dbflood and wgflood expect no queue \
                     error; the other queues run and are verified too",
                ),
                (
                    "die=HOW",
                    "die with GPU work in flight, after ringing the doorbells: triple (triple \
                     fault), exit (exit status 5 without unloading the queues), hang (spin \
                     until the host stops the VM), idle (halt until stopped, no CPU used)",
                ),
                (
                    "hold=H",
                    "polls or rings of bad=stall and bad=dbflood, and the most polls for a \
                     late queue error (default 1000, 1..=2^30)",
                ),
                (
                    "flood=F",
                    "first write F times to a doorbell and a register that do not exist \
                     (default 0, at most 2^24; tests the per-VM log rate limit)",
                ),
            ],
            exit: "0 ok; 1 wrong counters (or a bad= mode caused no queue error); 2 queue \
                   error or failed wait; 3 no vGPU; 4 bad arguments or not enough guest RAM; \
                   5 die=exit",
        },
    ),
    (
        "hello",
        ImageInfo {
            summary: "prints `hello from NAME (vm ID), args: [ARGS]` and exits",
            args: &[("exit=N", "exit status (default 0)")],
            exit: "`exit` (default 0)",
        },
    ),
    (
        "hostile",
        ImageInfo {
            summary: "hostile vGPU driver for tests (needs `gpu = true` and one queue's CWSR \
                      area of RAM): abuses PCI configuration space, every register, every \
                      doorbell offset and width, broken MQDs, malformed AQL packets, BAR moves \
                      under a loaded queue and an altered CWSR record, checks each answer \
                      against docs/vgpu-abi.md (`hostile: FAIL ...` lines), then runs a \
                      correct kernel",
            args: &[
                (
                    "mode=MODE",
                    "attack (default): the checks above; flood: print `lines` empty console \
                     lines and write `marks` checkpoints, then `hostile: flood done`; \
                     barrier: load `queues` vHQDs whose first packet is a barrier-AND on a \
                     signal nobody meets for `ms`, then meet it and check each kernel ran \
                     exactly once (`hostile: barrier ok`); rehang: load a kernel of \
                     hour-long workgroups without a save point and reload it after every \
                     reset (error 22) for `ms`, or until a reload is refused with 23 \
                     (`hostile: rehang N resets, quarantined Q`)",
                ),
                ("lines=N", "mode=flood: console lines (default 100000)"),
                ("marks=M", "mode=flood: checkpoints (default 100000)"),
                ("queues=N", "mode=barrier: blocked vHQDs (default 1, 1..=8)"),
                ("wgs=W", "mode=barrier and rehang: workgroups per kernel (default 304)"),
                (
                    "ms=M",
                    "mode=barrier: how long the barriers stay unmet (default 5000); \
                     mode=rehang: how long it keeps re-hanging (default 10000)",
                ),
            ],
            exit: "0 every answer as documented (or flood done, barrier ok, rehang done); 1 \
                   some were not (barrier: a kernel wrong or a queue error; rehang: an error \
                   other than 22 or 23); 3 no vGPU; 4 set-up failed",
        },
    ),
];

/// The description of the built-in image `name`, if there is one.
pub fn describe(name: &str) -> Option<&'static ImageInfo> {
    INFO.iter().find(|(n, _)| *n == name).map(|(_, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_is_a_static_x86_64_elf_loaded_at_1mib() {
        let elf = builtin("hello").expect("hello is built in");
        assert_eq!(&elf[..4], b"\x7fELF");
        assert_eq!(elf[4], 2, "64-bit");
        assert_eq!(u16::from_le_bytes([elf[18], elf[19]]), 62, "x86_64");
        let entry = u64::from_le_bytes(elf[24..32].try_into().unwrap());
        assert_eq!(entry, 0x10_0000);
    }

    #[test]
    fn unknown_name_is_none_and_names_are_sorted() {
        assert!(builtin("no-such-image").is_none());
        let v: Vec<_> = names().collect();
        let mut sorted = v.clone();
        sorted.sort();
        assert_eq!(v, sorted);
        assert!(v.contains(&"fault"));
    }

    #[test]
    fn every_built_in_image_is_described_and_every_description_is_built_in() {
        for name in names() {
            let info = describe(name).unwrap_or_else(|| panic!("{name} has no description"));
            assert!(!info.summary.is_empty() && !info.exit.is_empty(), "{name}");
        }
        for (name, _) in INFO {
            assert!(
                builtin(name).is_some(),
                "{name} is described but not built in"
            );
        }
        let gpu = describe("gpu").unwrap();
        for key in [
            "queues=",
            "kernels=",
            "wgs=",
            "cost_us=",
            "loops=",
            "priority=",
            "verbose=",
            "bad=",
        ] {
            assert!(
                gpu.args.iter().any(|(k, _)| k.starts_with(key)),
                "gpu documents {key}"
            );
        }
    }
}
