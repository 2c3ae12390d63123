//! The README's commands from a new checkout on a machine that has never built callstream: every
//! script creates what it writes to, and reaches cargo with the arguments it should.
//!
//! The checkout is the repository's tracked files as they are in the working tree (what a clone
//! of this commit holds), in a temporary directory. `cargo` is a stand-in on `PATH` that records
//! its arguments, so the C++ engines are not built again; everything else the scripts call
//! (setup's package and model checks, oneDNN's install) runs for real, with the models this
//! machine already has linked in, and `CARGO_TARGET_DIR` names a directory that does not exist.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    callstream_actors::package_dir(env!("CARGO_MANIFEST_DIR"))
}

/// A new checkout: the tracked files only, no target directory, the models linked in.
fn checkout(into: &Path) -> PathBuf {
    let repo = into.join("callstream");
    let listed = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(listed.status.success(), "git ls-files failed");
    for name in listed.stdout.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = std::str::from_utf8(name).unwrap();
        let from = root().join(name);
        // A tracked file deleted in the working tree is not in the checkout either.
        let Ok(meta) = std::fs::symlink_metadata(&from) else {
            continue;
        };
        let to = repo.join(name);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from).unwrap(), &to).unwrap();
        } else {
            std::fs::copy(&from, &to).unwrap();
        }
    }
    std::os::unix::fs::symlink(root().join("models"), repo.join("models")).unwrap();
    repo
}

/// A `cargo` that writes its arguments, a line per call, to `log`, and for `build` leaves a
/// `callstream` program in the target directory that writes its own arguments there too. It
/// fails unless the target directory exists and llama.cpp's CMake include is given as the copy
/// of scripts/cmake in it (a path that stays when the clone goes).
fn fake_cargo(bin: &Path, log: &Path) {
    std::fs::create_dir_all(bin).unwrap();
    let script = format!(
        r#"#!/bin/sh
echo "cargo $*" >> '{log}'
test -d "$CARGO_TARGET_DIR" || {{ echo "cargo: target directory $CARGO_TARGET_DIR is missing" >&2; exit 1; }}
case "$CMAKE_PROJECT_INCLUDE" in
    "$CARGO_TARGET_DIR"/*) cmp -s "$CMAKE_PROJECT_INCLUDE" '{include}' ||
        {{ echo "cargo: $CMAKE_PROJECT_INCLUDE is not scripts/cmake/llama-cpp.cmake" >&2; exit 1; }} ;;
    *) echo "cargo: CMAKE_PROJECT_INCLUDE=$CMAKE_PROJECT_INCLUDE is not in the target directory" >&2; exit 1 ;;
esac
if [ "$1" = build ]; then
    mkdir -p "$CARGO_TARGET_DIR/release"
    printf '#!/bin/sh\necho "callstream $*" >> %s\n' "'{log}'" > "$CARGO_TARGET_DIR/release/callstream"
    chmod +x "$CARGO_TARGET_DIR/release/callstream"
fi
"#,
        log = log.display(),
        include = root().join("scripts/cmake/llama-cpp.cmake").display(),
    );
    let path = bin.join("cargo");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A new checkout in a temporary directory, with the stand-in `cargo` and its log beside it.
struct Sandbox {
    dir: tempfile::TempDir,
    repo: PathBuf,
    log: PathBuf,
    bin: PathBuf,
}

impl Sandbox {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let repo = checkout(dir.path());
        let log = dir.path().join("cargo.log");
        let bin = dir.path().join("bin");
        fake_cargo(&bin, &log);
        Self {
            dir,
            repo,
            log,
            bin,
        }
    }
}

fn run(
    repo: &Path,
    script: &str,
    args: &[&str],
    bin: &Path,
    target: &Path,
) -> std::process::Output {
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    Command::new("bash")
        .arg(repo.join(script))
        .args(args)
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", target)
        // As on a machine where no wrapper is set yet.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .output()
        .unwrap()
}

#[test]
fn the_test_command_reaches_cargo_test_from_a_new_checkout() {
    let Sandbox {
        dir,
        repo,
        log,
        bin,
    } = Sandbox::new();
    let target = dir.path().join("no/such/target");
    let out = run(&repo, "scripts/test.sh", &[], &bin, &target);
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        out.status.success(),
        "scripts/test.sh failed: {}\n{}\ncargo was called as:\n{calls}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = calls.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some("cargo fmt --all -- --check"),
        "{calls}"
    );
    assert_eq!(
        lines.last().copied(),
        Some("cargo test --release --workspace --all-targets"),
        "{calls}"
    );
    assert!(target.is_dir());
}

#[test]
fn the_serve_command_builds_then_starts_the_binary_from_a_new_checkout() {
    // scripts/serve.sh is setup.sh (default models, which the test machine need not have), then
    // build.sh, then the binary; the part after setup runs here.
    let Sandbox {
        dir,
        repo,
        log,
        bin,
    } = Sandbox::new();
    let target = dir.path().join("no/such/target");
    let out = run(&repo, "scripts/build.sh", &[], &bin, &target);
    assert!(
        out.status.success(),
        "scripts/build.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let started = run(
        &repo,
        "scripts/callstream",
        &["serve", "--config", "x.toml"],
        &bin,
        &target,
    );
    assert!(started.status.success());
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        calls,
        "cargo build --release --workspace --all-targets\ncallstream serve --config x.toml\n"
    );
}

#[test]
fn serve_sh_is_setup_then_build_then_the_binary() {
    let text = std::fs::read_to_string(root().join("scripts/serve.sh")).unwrap();
    let commands: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter(|l| !l.starts_with("set ") && !l.starts_with("cd "))
        .collect();
    assert_eq!(
        commands,
        [
            "scripts/setup.sh",
            "scripts/build.sh",
            "exec scripts/callstream serve \"$@\""
        ]
    );
}

/// A target directory an earlier build left: llama.cpp's CMake include is refreshed in the copy
/// the build points at, a build directory CMake configured with another include path is pointed
/// at the copy, and the `lib*.so` links llama-cpp-sys-2 left pointing nowhere (which
/// make its build script fail with "File exists" when it runs again) are gone, while links
/// that resolve and everything else stay.
#[test]
fn a_used_target_directory_is_readied_for_llama_cpp_sys_2() {
    let Sandbox {
        dir,
        repo,
        log: _,
        bin,
    } = Sandbox::new();
    let target = dir.path().join("target");
    let release = target.join("release");
    std::fs::create_dir_all(release.join("deps")).unwrap();
    std::fs::create_dir_all(target.join("callstream-cmake")).unwrap();
    std::fs::write(target.join("callstream-cmake/llama-cpp.cmake"), "# old").unwrap();
    std::fs::write(target.join("callstream-cmake/gone.cpp"), "// removed since").unwrap();
    std::os::unix::fs::symlink("libllama.so.0", release.join("libllama.so")).unwrap();
    std::os::unix::fs::symlink("libggml.so.0", release.join("deps/libggml.so")).unwrap();
    std::fs::write(release.join("libkept.so.1"), "").unwrap();
    std::os::unix::fs::symlink("libkept.so.1", release.join("libkept.so")).unwrap();
    std::os::unix::fs::symlink("nowhere", release.join("other-link")).unwrap();
    // One llama.cpp build directory configured from a clone since deleted, one already right.
    let include = target.join("callstream-cmake/llama-cpp.cmake");
    let cache = |name: &str, path: &str| {
        let dir = release.join("build").join(name).join("out/build");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("CMakeCache.txt");
        std::fs::write(
            &file,
            format!("A:BOOL=ON\nCMAKE_PROJECT_INCLUDE:UNINITIALIZED={path}\nB:STRING=x\n"),
        )
        .unwrap();
        file
    };
    let stale = cache(
        "llama-cpp-sys-2-1",
        "/gone/clone/scripts/cmake/llama-cpp.cmake",
    );
    let right = cache("llama-cpp-sys-2-2", &include.display().to_string());
    let right_written = std::fs::metadata(&right).unwrap().modified().unwrap();
    let out = run(&repo, "scripts/build.sh", &[], &bin, &target);
    assert!(
        out.status.success(),
        "scripts/build.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exists = |p: &Path| std::fs::symlink_metadata(p).is_ok();
    assert!(!exists(&release.join("libllama.so")));
    assert!(!exists(&release.join("deps/libggml.so")));
    assert!(exists(&release.join("libkept.so")));
    assert!(exists(&release.join("other-link")));
    assert_eq!(
        std::fs::read(target.join("callstream-cmake/llama-cpp.cmake")).unwrap(),
        std::fs::read(root().join("scripts/cmake/llama-cpp.cmake")).unwrap()
    );
    assert!(!exists(&target.join("callstream-cmake/gone.cpp")));
    let wanted = format!(
        "A:BOOL=ON\nCMAKE_PROJECT_INCLUDE:UNINITIALIZED={}\nB:STRING=x\n",
        include.display()
    );
    assert_eq!(std::fs::read_to_string(&stale).unwrap(), wanted);
    assert_eq!(std::fs::read_to_string(&right).unwrap(), wanted);
    // A cache already right is left alone: touching it would make CMake configure again.
    assert_eq!(
        std::fs::metadata(&right).unwrap().modified().unwrap(),
        right_written
    );
}
