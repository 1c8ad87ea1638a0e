//! btrkit-mkfs: not built yet; see the open issues.

fn main() {
    eprintln!("btrkit-mkfs: not implemented yet");
    std::process::exit(2);
}
