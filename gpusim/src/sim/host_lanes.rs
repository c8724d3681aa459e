//! The roomy guest lanes of a partition grouped by their owner and the
//! footprint of the owner's workgroup: where a guest search
//! ([`SimGpu::try_guest`]) looks for a host CU.
//!
//! A search visited every roomy lane in round-robin order from the
//! partition's `guest_rr` and skipped those owned by the searching queue,
//! those whose owner leaves no room for its workgroup
//! ([`Footprint::fits_with`]) and those outside its CU mask. On a tenant
//! whose queues hold CU masks (a partition split around a real-time
//! queue), or whose workgroups pair with none of the running ones, most
//! visits were skips, at every workgroup end: a fifth to a third of the
//! simulator's instructions. The lanes' owners run few (owner, footprint)
//! pairs, so the lanes are kept per pair as a bit set, and a search ORs
//! the sets of the pairs that may host it (another owner, a footprint it
//! fits beside), ANDs its mask, and visits only those CUs, in the same
//! round-robin order: the CUs the old visit did not skip, so it finds the
//! same host. A search no pair may host visits nothing.
//!
//! [`SimGpu::try_guest`]: super::SimGpu::try_guest

use super::occupancy::Footprint;

/// The roomy lanes of one (owner, owner footprint) pair.
#[derive(Clone, Debug)]
struct Group {
    /// `cu_owner` of its lanes (slot + 1).
    owner: u32,
    /// The footprint of the owner's workgroup on its lanes.
    fp: Footprint,
    /// Its lanes, a bit per CU of the partition.
    bits: Vec<u64>,
    /// How many lanes it holds (0: free for another pair).
    count: u32,
}

/// A partition's roomy guest lanes by (owner, owner footprint); kept with
/// `Part::roomy`, `cu_owner` and `cu_fp` (a lane's pair is noted when it
/// becomes roomy; its owner and footprint change only after it left).
#[derive(Clone, Debug)]
pub(super) struct HostLanes {
    /// CUs of the partition.
    len: u32,
    /// Per CU: its group's index + 1 (0: not a roomy lane).
    of_cu: Vec<u32>,
    groups: Vec<Group>,
}

impl HostLanes {
    /// No roomy lanes among `len` CUs.
    pub(super) fn new(len: u32) -> Self {
        HostLanes {
            len,
            of_cu: vec![0; len as usize],
            groups: Vec::new(),
        }
    }

    fn words(&self) -> usize {
        self.len.div_ceil(64) as usize
    }

    /// `cu` is a roomy lane of `owner` running a workgroup of footprint
    /// `fp` (leaving its earlier group, if any). Ignored past the end.
    pub(super) fn insert(&mut self, cu: u32, owner: u32, fp: Footprint) {
        if cu >= self.len {
            return;
        }
        self.remove(cu);
        let gi = match self
            .groups
            .iter()
            .position(|g| g.count > 0 && g.owner == owner && g.fp == fp)
        {
            Some(i) => i,
            None => match self.groups.iter().position(|g| g.count == 0) {
                Some(i) => {
                    let g = &mut self.groups[i];
                    g.owner = owner;
                    g.fp = fp;
                    i
                }
                None => {
                    let words = self.words();
                    self.groups.push(Group {
                        owner,
                        fp,
                        bits: vec![0; words],
                        count: 0,
                    });
                    self.groups.len() - 1
                }
            },
        };
        let g = &mut self.groups[gi];
        g.bits[(cu / 64) as usize] |= 1u64 << (cu % 64);
        g.count += 1;
        self.of_cu[cu as usize] = gi as u32 + 1;
    }

    /// `cu` is no longer a roomy lane (nothing if it was not one).
    pub(super) fn remove(&mut self, cu: u32) {
        let Some(e) = self.of_cu.get_mut(cu as usize) else {
            return;
        };
        let Some(gi) = e.checked_sub(1) else {
            return;
        };
        *e = 0;
        if let Some(g) = self.groups.get_mut(gi as usize) {
            g.bits[(cu / 64) as usize] &= !(1u64 << (cu % 64));
            g.count = g.count.saturating_sub(1);
        }
    }

    /// The (owner, footprint) pair noted for `cu`, if it is a roomy lane.
    pub(super) fn pair_of(&self, cu: u32) -> Option<(u32, Footprint)> {
        let gi = self.of_cu.get(cu as usize)?.checked_sub(1)?;
        let g = self.groups.get(gi as usize)?;
        Some((g.owner, g.fp))
    }

    /// The roomy lanes that may host a workgroup of footprint `fp` of the
    /// queue whose `cu_owner` value is `owner`: another owner's, whose
    /// footprint leaves room for `fp`, and in `mask` (a CU mask's words;
    /// `None`: every CU). Written to `out` (a bit per CU); `false` if there
    /// are none.
    pub(super) fn hosts_for(
        &self,
        owner: u32,
        fp: Footprint,
        mask: Option<&[u64]>,
        out: &mut Vec<u64>,
    ) -> bool {
        out.clear();
        out.resize(self.words(), 0);
        let mut any = false;
        for g in &self.groups {
            if g.count == 0 || g.owner == owner || !g.fp.fits_with(fp) {
                continue;
            }
            any = true;
            for (o, b) in out.iter_mut().zip(&g.bits) {
                *o |= b;
            }
        }
        if !any {
            return false;
        }
        if let Some(m) = mask {
            for (i, o) in out.iter_mut().enumerate() {
                *o &= m.get(i).copied().unwrap_or(0);
            }
        }
        out.iter().any(|&w| w != 0)
    }

    /// The CUs set in `words` (as [`Self::hosts_for`] writes them) in
    /// round-robin order from `start`, as `CuMask::iter_from` visits a
    /// mask: those at or after `start` (0 when past the end), then those
    /// before it.
    pub(super) fn iter_from<'a>(&self, words: &'a [u64], start: u32) -> RoundRobin<'a> {
        let start = if start < self.len { start } else { 0 };
        RoundRobin {
            words,
            len: self.len,
            start,
            at: start,
            wrapped: false,
        }
    }
}

/// The first CU set in `words` in `from..end`.
fn next_set(words: &[u64], from: u32, end: u32) -> Option<u32> {
    let mut i = from / 64;
    let mut w = words.get(i as usize).copied().unwrap_or(0) & (!0u64 << (from % 64));
    loop {
        if w != 0 {
            let c = i * 64 + w.trailing_zeros();
            return (c < end).then_some(c);
        }
        i += 1;
        if i * 64 >= end {
            return None;
        }
        w = words.get(i as usize).copied().unwrap_or(0);
    }
}

/// [`HostLanes::iter_from`]'s iterator.
pub(super) struct RoundRobin<'a> {
    words: &'a [u64],
    len: u32,
    start: u32,
    /// The next CU to look at.
    at: u32,
    /// Past the end once: looking at `0..start`.
    wrapped: bool,
}

impl Iterator for RoundRobin<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        loop {
            let end = if self.wrapped { self.start } else { self.len };
            if self.at < end {
                if let Some(c) = next_set(self.words, self.at, end) {
                    self.at = c + 1;
                    return Some(c);
                }
            }
            if self.wrapped {
                self.at = end;
                return None;
            }
            self.wrapped = true;
            self.at = 0;
        }
    }
}
