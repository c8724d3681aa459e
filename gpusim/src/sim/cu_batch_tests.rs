//! Tests of the per-CU batch index (`sim/cu_batch.rs`): the entry of a CU
//! names its batch while the CU sits in that batch's list, and nothing
//! once a pop or a reuse of the batch index moved it.

use super::cu_batch::CuBatchIndex;

/// Pushes `cu` to batch `b`'s list, noting it, as `start_batched` does.
fn push(ix: &mut CuBatchIndex, lists: &mut [Vec<u32>], b: usize, cu: u32) {
    ix.note(cu, b as u32, lists[b].len());
    lists[b].push(cu);
}

/// The slow path the guest search used: the first list holding `cu`.
fn scan(lists: &[Vec<u32>], cu: u32) -> Option<usize> {
    lists.iter().position(|l| l.contains(&cu))
}

#[test]
fn a_cu_never_pushed_is_in_no_batch() {
    let ix = CuBatchIndex::new(8);
    let lists = vec![vec![], vec![]];
    for cu in 0..8 {
        assert_eq!(ix.holder(cu, &lists), None);
    }
    // Outside the partition: nothing, no panic.
    assert_eq!(ix.holder(8, &lists), None);
    assert_eq!(ix.holder(u32::MAX, &lists), None);
}

#[test]
fn a_pushed_cu_is_found_until_popped() {
    let mut ix = CuBatchIndex::new(8);
    let mut lists = vec![vec![], vec![]];
    push(&mut ix, &mut lists, 1, 3);
    push(&mut ix, &mut lists, 1, 5);
    push(&mut ix, &mut lists, 0, 4);
    assert_eq!(ix.holder(3, &lists), Some(1));
    assert_eq!(ix.holder(5, &lists), Some(1));
    assert_eq!(ix.holder(4, &lists), Some(0));
    // Given back from the end of the list (`release_batch_cus`).
    lists[1].pop();
    assert_eq!(ix.holder(5, &lists), None);
    assert_eq!(ix.holder(3, &lists), Some(1));
}

#[test]
fn a_cu_moved_to_another_batch_names_the_new_one() {
    let mut ix = CuBatchIndex::new(8);
    let mut lists = vec![vec![], vec![], vec![]];
    push(&mut ix, &mut lists, 0, 2);
    lists[0].pop();
    push(&mut ix, &mut lists, 2, 7);
    push(&mut ix, &mut lists, 2, 2);
    assert_eq!(ix.holder(2, &lists), Some(2));
}

#[test]
fn a_reused_batch_index_does_not_keep_its_old_cus() {
    let mut ix = CuBatchIndex::new(8);
    let mut lists = vec![vec![]];
    push(&mut ix, &mut lists, 0, 1);
    push(&mut ix, &mut lists, 0, 6);
    // The batch dies with its list stale, and the index is reused
    // (`new_batch` clears the list) for other CUs.
    lists[0].clear();
    push(&mut ix, &mut lists, 0, 6);
    assert_eq!(ix.holder(1, &lists), None);
    assert_eq!(ix.holder(6, &lists), Some(0));
    // Another CU landed at the position CU 1 had: still not CU 1's.
    push(&mut ix, &mut lists, 0, 3);
    assert_eq!(ix.holder(1, &lists), None);
    assert_eq!(ix.holder(3, &lists), Some(0));
}

#[test]
fn the_index_agrees_with_the_scan_over_random_pushes_and_pops() {
    // A CU sits in at most one list (taken free, pushed once, freed by
    // the pop that removes it, or its whole list dropped): under that
    // rule the index gives what a scan of every list gives.
    let cus = 40u32;
    let nb = 6usize;
    let mut ix = CuBatchIndex::new(cus);
    let mut lists: Vec<Vec<u32>> = vec![Vec::new(); nb];
    let mut free: Vec<u32> = (0..cus).collect();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    for _ in 0..20_000 {
        match next(4) {
            0 | 1 if !free.is_empty() => {
                let cu = free.swap_remove(next(free.len() as u64) as usize);
                push(&mut ix, &mut lists, next(nb as u64) as usize, cu);
            }
            2 => {
                if let Some(cu) = lists[next(nb as u64) as usize].pop() {
                    free.push(cu);
                }
            }
            _ => {
                // A batch ends with every CU given back, or dies and its
                // index is reused (its list cleared).
                let b = next(nb as u64) as usize;
                free.append(&mut lists[b]);
            }
        }
        for cu in 0..cus {
            assert_eq!(ix.holder(cu, &lists), scan(&lists, cu), "CU {cu}");
        }
    }
}
