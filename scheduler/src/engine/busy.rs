//! A partition's busy (Ready/Saved/Running) queue counts per level per VM,
//! with the part of `BTreeMap<u16, BTreeMap<VmId, u32>>`'s interface the
//! engine uses, over a fixed table of the 17 levels (VM priorities 0..=15
//! and the boost level) and a bit mask of the busy ones. A level's lookup
//! is an index, not a tree descent, and a level that stops being busy keeps
//! its (empty) map's node, so the doorbell that makes it busy again does not
//! allocate: fewer cache lines and no `malloc` on the doorbell path.

use crate::VmId;
use std::collections::BTreeMap;
use std::ops::RangeTo;

/// Number of levels: VM priorities 0..=15 and the boost level 16.
const LEVELS: usize = 17;

/// Level numbers, for iterators that hand out `&u16` keys.
static LEVEL_KEYS: [u16; LEVELS] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];

/// Busy queue counts per level per VM (see the module doc).
#[derive(Clone, Debug, Default)]
pub(super) struct BusyLevels {
    /// Bit `l` set: level `l` is present (as a key of the map it replaces).
    present: u32,
    per_level: [BTreeMap<VmId, u32>; LEVELS],
    /// Per level, the sum of the weights of the VMs in its map, kept by the
    /// engine's index and weight changes ([`Self::add_weight`]) so that a
    /// slice end or a share test does not look every busy VM up.
    weights: [u128; LEVELS],
}

/// [`BusyLevels::entry`].
pub(super) struct BusyEntry<'a> {
    levels: &'a mut BusyLevels,
    level: usize,
}

impl<'a> BusyEntry<'a> {
    /// The level's map, made present (empty) if it was not.
    pub(super) fn or_default(self) -> &'a mut BTreeMap<VmId, u32> {
        self.levels.present |= 1 << self.level;
        &mut self.levels.per_level[self.level]
    }
}

impl BusyLevels {
    fn has(&self, l: usize) -> bool {
        l < LEVELS && self.present & (1 << l) != 0
    }

    /// Present levels, lowest first.
    pub(super) fn keys(&self) -> impl DoubleEndedIterator<Item = &u16> + '_ {
        (0..LEVELS).filter(|&l| self.has(l)).map(|l| &LEVEL_KEYS[l])
    }

    /// Present levels' maps, lowest level first.
    pub(super) fn values(&self) -> impl DoubleEndedIterator<Item = &BTreeMap<VmId, u32>> + '_ {
        (0..LEVELS)
            .filter(|&l| self.has(l))
            .map(|l| &self.per_level[l])
    }

    /// Present levels and their maps, lowest level first.
    #[allow(dead_code)] // part of the map interface; the engine does not use it today
    pub(super) fn iter(
        &self,
    ) -> impl DoubleEndedIterator<Item = (&u16, &BTreeMap<VmId, u32>)> + '_ {
        self.range(..LEVELS as u16)
    }

    /// Present levels below `r.end` and their maps, lowest first.
    pub(super) fn range(
        &self,
        r: RangeTo<u16>,
    ) -> impl DoubleEndedIterator<Item = (&u16, &BTreeMap<VmId, u32>)> + '_ {
        (0..(r.end as usize).min(LEVELS))
            .filter(|&l| self.has(l))
            .map(|l| (&LEVEL_KEYS[l], &self.per_level[l]))
    }

    /// Number of present levels.
    #[allow(dead_code)] // part of the map interface; the engine does not use it today
    pub(super) fn len(&self) -> usize {
        self.present.count_ones() as usize
    }

    /// No level present?
    #[allow(dead_code)] // part of the map interface; the engine does not use it today
    pub(super) fn is_empty(&self) -> bool {
        self.present == 0
    }

    /// Is `level` present?
    pub(super) fn contains_key(&self, level: &u16) -> bool {
        self.has(*level as usize)
    }

    /// The map of a present level.
    pub(super) fn get(&self, level: &u16) -> Option<&BTreeMap<VmId, u32>> {
        let l = *level as usize;
        self.has(l).then(|| &self.per_level[l])
    }

    /// The map of a present level, mutable.
    pub(super) fn get_mut(&mut self, level: &u16) -> Option<&mut BTreeMap<VmId, u32>> {
        let l = *level as usize;
        if self.has(l) {
            Some(&mut self.per_level[l])
        } else {
            None
        }
    }

    /// `level`'s entry (see [`BusyEntry::or_default`]). Panics for a level
    /// above the boost level (the engine never forms one).
    pub(super) fn entry(&mut self, level: u16) -> BusyEntry<'_> {
        assert!((level as usize) < LEVELS, "busy level {level} out of range");
        BusyEntry {
            levels: self,
            level: level as usize,
        }
    }

    /// Adds `w` to the weight sum of `level` (a VM entering its map, or a
    /// weight change of one in it); `w` may be negative.
    pub(super) fn add_weight(&mut self, level: u16, w: i128) {
        if let Some(x) = self.weights.get_mut(level as usize) {
            *x = x.saturating_add_signed(w);
        }
    }

    /// The sum of the weights of the VMs busy at `level`.
    pub(super) fn weight_sum(&self, level: u16) -> u128 {
        self.weights.get(level as usize).copied().unwrap_or(0)
    }

    /// Makes `level` absent and returns its map (an empty one keeps its
    /// node in the table, so making the level busy again does not allocate).
    pub(super) fn remove(&mut self, level: &u16) -> Option<BTreeMap<VmId, u32>> {
        let l = *level as usize;
        if !self.has(l) {
            return None;
        }
        self.present &= !(1 << l);
        let m = &mut self.per_level[l];
        Some(if m.is_empty() {
            BTreeMap::new()
        } else {
            std::mem::take(m)
        })
    }
}

impl std::ops::Index<&u16> for BusyLevels {
    type Output = BTreeMap<VmId, u32>;
    /// The map of a present level; panics if it is absent (as a map's
    /// index does).
    fn index(&self, level: &u16) -> &Self::Output {
        self.get(level).expect("busy level not present")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Add(u16, u32),
        Sub(u16, u32),
        Remove(u16),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u16..17, 0u32..4).prop_map(|(l, v)| Op::Add(l, v)),
            (0u16..17, 0u32..4).prop_map(|(l, v)| Op::Sub(l, v)),
            (0u16..17).prop_map(Op::Remove),
        ]
    }

    proptest! {
        /// Behaves as the `BTreeMap<u16, BTreeMap<VmId, u32>>` it replaces
        /// under the engine's index/unindex pattern and removals.
        #[test]
        fn matches_a_map_of_maps(ops in prop::collection::vec(op(), 1..300)) {
            let mut b = BusyLevels::default();
            let mut m: BTreeMap<u16, BTreeMap<VmId, u32>> = BTreeMap::new();
            for o in &ops {
                match *o {
                    Op::Add(l, v) => {
                        *b.entry(l).or_default().entry(VmId(v)).or_default() += 1;
                        *m.entry(l).or_default().entry(VmId(v)).or_default() += 1;
                    }
                    Op::Sub(l, v) => {
                        let mut emptied = [false; 2];
                        if let Some(x) = b.get_mut(&l) {
                            if let Some(c) = x.get_mut(&VmId(v)) {
                                *c -= 1;
                                if *c == 0 {
                                    x.remove(&VmId(v));
                                }
                            }
                            emptied[0] = x.is_empty();
                        }
                        if let Some(x) = m.get_mut(&l) {
                            if let Some(c) = x.get_mut(&VmId(v)) {
                                *c -= 1;
                                if *c == 0 {
                                    x.remove(&VmId(v));
                                }
                            }
                            emptied[1] = x.is_empty();
                        }
                        prop_assert_eq!(emptied[0], emptied[1]);
                        if emptied[0] {
                            b.remove(&l);
                            m.remove(&l);
                        }
                    }
                    Op::Remove(l) => {
                        prop_assert_eq!(b.remove(&l), m.remove(&l));
                    }
                }
                prop_assert_eq!(b.keys().copied().collect::<Vec<_>>(), m.keys().copied().collect::<Vec<_>>());
                prop_assert_eq!(b.keys().next_back(), m.keys().next_back());
                prop_assert_eq!(b.len(), m.len());
                prop_assert_eq!(b.is_empty(), m.is_empty());
                for cut in [0u16, 2, 9, 16, 17] {
                    let x: Vec<_> = b.range(..cut).collect();
                    let y: Vec<_> = m.range(..cut).collect();
                    prop_assert_eq!(x, y);
                }
                prop_assert_eq!(b.iter().collect::<Vec<_>>(), m.iter().collect::<Vec<_>>());
                prop_assert_eq!(b.values().collect::<Vec<_>>(), m.values().collect::<Vec<_>>());
                for l in 0u16..18 {
                    prop_assert_eq!(b.contains_key(&l), m.contains_key(&l));
                    prop_assert_eq!(b.get(&l), m.get(&l));
                }
            }
        }
    }
}
