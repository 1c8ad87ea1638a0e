//! btrkit-replay: not built yet; see the open issues.

fn main() {
    eprintln!("btrkit-replay: not implemented yet");
    std::process::exit(2);
}
