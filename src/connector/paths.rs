//! Which of the server's files a connector may read or write (`allowed_paths` in the config):
//! with directories configured, a `file` source's or sink's path must lie under one of them,
//! after symbolic links are followed, for every role; without, only a superuser may name the
//! server's files, as PostgreSQL lets only superusers (and `pg_read_server_files`) `COPY`
//! from them. A path with `..` in it is refused either way. Refusals are 42501.

use std::path::{Component, Path, PathBuf};

use crate::error::{Error, ErrorKind, Result};

/// Who names a path, and where the server lets anyone.
pub struct FileAccess<'a> {
    pub allowed: &'a [PathBuf],
    pub superuser: bool,
}

/// Checks that a connector may use `path` on the server's file system.
pub fn check(path: &str, access: &FileAccess<'_>) -> Result<()> {
    let denied = |why: String| Error::new(ErrorKind::InsufficientPrivilege, why);
    let given = Path::new(path);
    if given.components().any(|c| c == Component::ParentDir) {
        return Err(denied(format!(
            "permission denied for path \"{path}\": it must not contain \"..\""
        )));
    }
    if access.allowed.is_empty() {
        if access.superuser {
            return Ok(());
        }
        return Err(denied(format!(
            "permission denied to use the server's file \"{path}\""
        ))
        .with_hint(
            "Only superusers may, unless the config's allowed_paths names directories every \
             role may use.",
        ));
    }
    let resolved = resolve(given)?;
    let inside = access.allowed.iter().any(|dir| {
        // A directory that does not exist (yet) holds nothing.
        dir.canonicalize()
            .is_ok_and(|dir| resolved.starts_with(dir))
    });
    if inside {
        return Ok(());
    }
    Err(denied(format!(
        "permission denied for path \"{path}\": it is outside the directories of allowed_paths"
    )))
}

/// `path` with every symbolic link of the part that exists followed, the rest appended: a
/// sink's directory, or a source's file, may not exist yet.
fn resolve(path: &Path) -> Result<PathBuf> {
    let absolute = match path.is_absolute() {
        true => path.to_path_buf(),
        false => std::env::current_dir()?.join(path),
    };
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        match existing.canonicalize() {
            Ok(found) => {
                return Ok(rest.iter().rev().fold(found, |p, c| p.join(c)));
            }
            Err(_) => match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_os_string());
                    existing = parent;
                }
                _ => return Ok(absolute),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_confined_to_the_allowed_directories_with_links_followed() {
        let dir = tempfile::tempdir().unwrap();
        let allowed = dir.path().join("allowed");
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(allowed.join("in")).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, allowed.join("out")).unwrap();
        std::os::unix::fs::symlink(allowed.join("in"), elsewhere.join("back")).unwrap();
        let dirs = [allowed.clone()];
        let user = FileAccess {
            allowed: &dirs,
            superuser: false,
        };
        let code = |p: &Path, access: &FileAccess| match check(p.to_str().unwrap(), access) {
            Ok(()) => "ok".to_string(),
            Err(e) if e.kind == ErrorKind::InsufficientPrivilege => "denied".to_string(),
            Err(e) => e.to_string(),
        };
        assert_eq!(code(&allowed.join("in/a.csv"), &user), "ok");
        // Not there yet: a sink's directory.
        assert_eq!(code(&allowed.join("new/deeper"), &user), "ok");
        assert_eq!(code(&allowed, &user), "ok");
        // Through a link into the allowed directory.
        assert_eq!(code(&elsewhere.join("back/a.csv"), &user), "ok");
        for refused in [
            elsewhere.join("a.csv"),
            allowed.join("out/a.csv"),
            allowed.join("in/../../elsewhere/a.csv"),
            allowed.join("in/.."),
            PathBuf::from("/etc/passwd"),
        ] {
            assert_eq!(code(&refused, &user), "denied", "{refused:?}");
        }
        // The same holds for a superuser once directories are configured.
        let superuser = FileAccess {
            allowed: &dirs,
            superuser: true,
        };
        assert_eq!(code(Path::new("/etc/passwd"), &superuser), "denied");
        // Without allowed_paths, only superusers name the server's files.
        let open = FileAccess {
            allowed: &[],
            superuser: true,
        };
        assert_eq!(code(Path::new("/etc/passwd"), &open), "ok");
        assert_eq!(code(&allowed.join("x/../y"), &open), "denied");
        let closed = FileAccess {
            allowed: &[],
            superuser: false,
        };
        assert_eq!(code(&allowed.join("in/a.csv"), &closed), "denied");
    }
}
