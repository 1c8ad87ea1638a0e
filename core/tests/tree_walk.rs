//! The one tree walk with a visitor of its own (the checker's way of using
//! it): a block the visitor passes by in `load` is neither visited nor
//! followed, `children` sees each node's children in key order before they
//! are read, `done` receives every block read exactly once, and a second
//! walk through the same `seen` set meets only the start block again.

mod common;

use btrkit_core::format::key::Key;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::trans::{Store, TreeId};
use btrkit_core::tree::{walk_with, Expect, Node, Place, Problem, Visitor, WalkEvent, WalkOptions};
use common::*;
use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;

#[derive(Default)]
struct Recorder {
    /// Blocks to pass by unread.
    skip: HashSet<u64>,
    visited: Vec<(u64, u8)>,
    done: Vec<u64>,
    /// Children announced per node, in the order given.
    children: HashMap<u64, Vec<u64>>,
    revisits: Vec<u64>,
}

impl Visitor for Recorder {
    type Break = ();
    fn load(
        &mut self,
        img: &Image,
        at: &Place,
        log: bool,
    ) -> Option<btrkit_core::Result<(Node, Vec<Problem>)>> {
        if self.skip.contains(&at.bytenr) {
            return None;
        }
        Some(img.read_tree_block_checked(at.bytenr, &at.expect, log))
    }
    fn event(&mut self, ev: WalkEvent<'_>) -> ControlFlow<(), bool> {
        match ev {
            WalkEvent::Block { node, problems, .. } => {
                assert!(problems.is_empty(), "{problems:?}");
                self.visited.push((node.bytenr, node.level()));
            }
            WalkEvent::Revisit { bytenr, .. } => self.revisits.push(bytenr),
            other => panic!("unexpected event on a clean image: {}", kind(&other)),
        }
        ControlFlow::Continue(true)
    }
    fn children(&mut self, _img: &Image, node: &Node, children: &[Place]) {
        let keys: Vec<Key> = children
            .iter()
            .map(|c| c.expect.first_key.unwrap())
            .collect();
        assert!(
            keys.windows(2).all(|w| w[0] < w[1]),
            "children out of key order"
        );
        let prev = self
            .children
            .insert(node.bytenr, children.iter().map(|c| c.bytenr).collect());
        assert!(
            prev.is_none(),
            "children of {} announced twice",
            node.bytenr
        );
    }
    fn done(&mut self, node: Node) {
        self.done.push(node.bytenr);
    }
}

fn kind(ev: &WalkEvent<'_>) -> &'static str {
    match ev {
        WalkEvent::Block { .. } => "block",
        WalkEvent::Unreadable { .. } => "unreadable",
        WalkEvent::Revisit { .. } => "revisit",
        WalkEvent::Excluded { .. } => "excluded",
    }
}

#[test]
fn a_visitor_reads_passes_by_and_keeps_blocks() {
    let dev = new_image(256 << 20, &["-n", "4096"]);
    let mut st = Store::open(dev.clone()).unwrap();
    // Enough items for a tree of three levels at 4 KiB blocks.
    let tree = TreeId::Tree(5);
    let body = vec![0x5au8; 100];
    for i in 0..12_000u64 {
        st.insert_item(tree, &Key::new(1 << 40, 5, i), &body)
            .unwrap();
    }
    st.commit().unwrap();
    drop(st);

    let img = Image::open(dev.clone(), OpenOptions::default()).unwrap();
    let root = img.find_root(5).unwrap().unwrap();
    assert!(root.level >= 2, "the tree has {} levels", root.level + 1);
    let start = || Place::start(root.bytenr, Expect::root(&root));
    let opts = WalkOptions::default();

    let mut all = Recorder::default();
    let mut seen = HashSet::new();
    assert!(walk_with(&img, start(), &opts, &mut seen, &mut all).is_continue());
    // Every block once, each handed back once, nodes announce their children.
    let blocks: HashSet<u64> = all.visited.iter().map(|b| b.0).collect();
    assert_eq!(blocks.len(), all.visited.len());
    let mut done = all.done.clone();
    done.sort_unstable();
    let mut visited: Vec<u64> = blocks.iter().copied().collect();
    visited.sort_unstable();
    assert_eq!(done, visited);
    let nodes = all.visited.iter().filter(|b| b.1 > 0).count();
    assert_eq!(all.children.len(), nodes);
    let announced: usize = all.children.values().map(Vec::len).sum();
    assert_eq!(announced + 1, all.visited.len());
    // Depth first: the leaves come in the order their parents list them.
    let leaves: Vec<u64> = all
        .visited
        .iter()
        .filter(|b| b.1 == 0)
        .map(|b| b.0)
        .collect();
    let level1: Vec<u64> = all
        .visited
        .iter()
        .filter(|b| b.1 == 1)
        .flat_map(|b| all.children[&b.0].clone())
        .collect();
    assert_eq!(leaves, level1);

    // The same set again: only the start block, as a revisit.
    let mut again = Recorder::default();
    assert!(walk_with(&img, start(), &opts, &mut seen, &mut again).is_continue());
    assert!(again.visited.is_empty() && again.done.is_empty());
    assert_eq!(again.revisits, vec![root.bytenr]);

    // A level-1 node passed by: neither it nor anything under it is read.
    let (skipped, _) = *all.visited.iter().find(|b| b.1 == 1).unwrap();
    let under: HashSet<u64> = all.children[&skipped].iter().copied().collect();
    let mut part = Recorder {
        skip: HashSet::from([skipped]),
        ..Default::default()
    };
    assert!(walk_with(&img, start(), &opts, &mut HashSet::new(), &mut part).is_continue());
    assert_eq!(part.visited.len(), all.visited.len() - 1 - under.len());
    assert!(part
        .visited
        .iter()
        .all(|b| b.0 != skipped && !under.contains(&b.0)));
}
