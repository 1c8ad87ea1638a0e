//! btrkit-kcrash: the kernel crash-image generator of the tests, by hand.
//!
//!   btrkit-kcrash run SCENARIO.scn OUTDIR   crash image OUTDIR/crash.img and the
//!                                           kernel's replay manifest OUTDIR/kernel.txt
//!   btrkit-kcrash manifest IMAGE [--ro]     manifest of IMAGE after the kernel
//!                                           mounts a copy (read-write: replays a log)
//!   btrkit-kcrash diff IMAGE_A IMAGE_B      manifests of both, their differences
//!   btrkit-kcrash headline                  build (or reuse) the cached crash image of
//!                                           the 10,000-file headline workload, print its path
//!   btrkit-kcrash cached SCENARIO.scn       the same for any scenario
//!
//! Needs root, loop devices, btrfs in the kernel and btrfs-progs.

use btrkit_tests::kcrash;
use std::path::{Path, PathBuf};

fn main() {
    if let Err(e) = real_main() {
        eprintln!("btrkit-kcrash: {e}");
        std::process::exit(1);
    }
}

fn usage() -> String {
    "usage: btrkit-kcrash run SCENARIO OUTDIR | manifest IMAGE [--ro] | diff IMAGE_A IMAGE_B | headline | cached SCENARIO".into()
}

fn manifest(img: &Path, opts: &str) -> Result<kcrash::Manifest, String> {
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    kcrash::manifest_via_copy(img, &work.path().join("copy.img"), opts)
}

fn real_main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    if matches!(a.first(), Some(&("-h" | "--help"))) {
        println!("{}", usage());
        return Ok(());
    }
    kcrash::can_run()?;
    match a.as_slice() {
        ["run", scn, out] => {
            let s = kcrash::load_scenario(Path::new(scn))?;
            let out = PathBuf::from(out);
            let c = kcrash::generate(&s, &out)?;
            let m = kcrash::manifest_of_image(&c.path, &out)?;
            std::fs::write(out.join("kernel.txt"), m.render()).map_err(|e| e.to_string())?;
            for f in kcrash::check_expectations(&s, &m, &kcrash::Outcome::default()) {
                eprintln!("expectation failed: {f}");
            }
            println!(
                "{} (generation {}, log_root {})",
                c.path.display(),
                c.generation,
                c.log_root
            );
            Ok(())
        }
        ["manifest", img] => {
            print!("{}", manifest(Path::new(img), "rw")?.render());
            Ok(())
        }
        ["manifest", img, "--ro"] => {
            print!("{}", manifest(Path::new(img), "ro")?.render());
            Ok(())
        }
        ["diff", x, y] => {
            let (ma, mb) = (manifest(Path::new(x), "rw")?, manifest(Path::new(y), "rw")?);
            let d = ma.diff(&mb);
            if d.is_empty() {
                println!("identical");
                Ok(())
            } else {
                println!("{}", d.join("\n"));
                Err(format!("{} differences", d.len()))
            }
        }
        ["headline"] => {
            let c = kcrash::cached_crash_image(
                &kcrash::headline_scenario(),
                &kcrash::default_cache_dir(),
            )?;
            println!("{}", c.path.display());
            Ok(())
        }
        ["cached", scn] => {
            let s = kcrash::load_scenario(Path::new(scn))?;
            let c = kcrash::cached_crash_image(&s, &kcrash::default_cache_dir())?;
            println!("{}", c.path.display());
            Ok(())
        }
        _ => Err(usage()),
    }
}
