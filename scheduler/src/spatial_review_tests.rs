//! Hostile-review tests of spatial sharing (VM lifecycle).

use super::*;

/// A removed VM's dispatch width is forgotten: a new VM that reuses its id
/// and has shown no dispatch gets no reservation (lower work is preempted
/// as for any VM of unknown width), and the per-VM width table does not
/// grow with every VM ever run.
#[test]
fn a_removed_vms_dispatch_width_is_forgotten() {
    let mut w = World::new(cfg(Policy::Hqdmux), slots(1, 2, 4));
    w.s.set_cu_geometry(38, 8);
    let lo = w.vm(0, 2, 1, 1)[0];
    let old = w.vm(1, 12, 1, 1)[0];
    w.s.note_dispatch_width(old, 1);
    w.s.remove_vm(VmId(1)).unwrap();
    w.submit(lo, 1000 * MS);
    w.run_until(MS);
    let rt = w.vm(1, 12, 1, 1)[0];
    w.submit(rt, 20_000);
    w.run_until(2 * MS);
    assert_eq!(w.s.spatial_stats().established, 0);
    assert_eq!(w.s.vm_stats(VmId(0)).unwrap().preemptions, 1);
}
