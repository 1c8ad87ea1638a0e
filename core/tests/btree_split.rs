//! A big item in the middle of a full leaf: no single split point leaves
//! room for it beside its neighbours, so the leaf is split twice and the
//! item gets a leaf of its own (the kernel's split_leaf does the same);
//! every item is where it was after a commit and a fresh open.

mod common;

use btrkit_core::format::key::Key;
use btrkit_core::trans::{Store, TreeId};
use common::*;

#[test]
fn a_big_item_in_the_middle_of_a_full_leaf_splits_it_twice() {
    let dev = new_image(256 << 20, &["-n", "4096"]);
    let mut st = Store::open(dev.clone()).unwrap();
    let tree = TreeId::Tree(5);
    // Objectid far above any inode: these items stand alone at the end of
    // the tree. Filling in order leaves the last leaf full.
    let key = |off: u64| Key::new(1 << 40, 5, off);
    let small = vec![0x5au8; 100];
    for i in 0..120u64 {
        st.insert_item(tree, &key(i * 2), &small).unwrap();
    }
    // The last leaf is full of small items; one of 3,400 bytes goes in the
    // middle of it.
    let big = vec![0xa5u8; 3400];
    let mut placed = None;
    for i in (1..120u64).rev() {
        let k = key(i * 2 - 1);
        if st.lookup(tree, &k).unwrap().is_none() {
            placed = Some(k);
            break;
        }
    }
    let k = placed.unwrap();
    let k = Key::new(k.objectid, k.ty, 2 * 110 + 1);
    st.insert_item(tree, &k, &big).unwrap();
    st.commit().unwrap();
    drop(st);
    let mut st = Store::open(dev.clone()).unwrap();
    for i in 0..120u64 {
        assert_eq!(
            st.lookup(tree, &key(i * 2)).unwrap().as_deref(),
            Some(&small[..]),
            "item {i}"
        );
    }
    assert_eq!(st.lookup(tree, &k).unwrap().as_deref(), Some(&big[..]));
    let all = st.items_in(tree, key(0), key(u64::MAX)).unwrap();
    assert_eq!(all.len(), 121);
    assert!(
        all.windows(2).all(|w| w[0].0 < w[1].0),
        "items out of order"
    );
}
