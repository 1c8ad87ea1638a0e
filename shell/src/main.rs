//! btrkit-shell: not built yet; see the open issues.

fn main() {
    eprintln!("btrkit-shell: not implemented yet");
    std::process::exit(2);
}
