//! Text rendering of decoded items, shaped like btrfs-progs print-tree.c.
