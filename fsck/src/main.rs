//! btrkit-fsck: not built yet; see the open issues.

fn main() {
    eprintln!("btrkit-fsck: not implemented yet");
    std::process::exit(2);
}
