//! `redoubt pin`: the executable's hash written into `[recovery] executable_blake3` of an
//! existing cluster file, everything else in it (comments, order, layout) left as it was.

use crate::{ClusterConfig, ConfigError};
use std::path::Path;

/// Sets `[recovery] executable_blake3 = "<blake3>"` in the cluster file at `path` (adding
/// the table or key if missing), checks that the result still loads, and writes it in place
/// (through a temporary file and a rename, so a reader never sees half a file). Returns the
/// pin it replaced (empty if none).
pub fn pin_executable(path: &Path, blake3: &str) -> Result<String, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field: "[recovery] executable_blake3".into(),
        message,
    };
    if redoubt_keyholder::unhex32(blake3).is_err() {
        return Err(invalid(format!("{blake3:?} is not 64 hex digits")));
    }
    let src = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    // The file must load before it is touched: a broken file is reported as it is.
    ClusterConfig::parse(path, &src)?;
    let mut doc: toml_edit::DocumentMut = src
        .parse()
        .map_err(|e: toml_edit::TomlError| invalid(e.to_string()))?;
    let recovery = doc
        .entry("recovery")
        .or_insert_with(toml_edit::table)
        .as_table_mut()
        .ok_or_else(|| invalid("[recovery] is not a table".into()))?;
    let old = recovery
        .get("executable_blake3")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    recovery["executable_blake3"] = toml_edit::value(blake3.to_ascii_lowercase());
    let text = doc.to_string();
    ClusterConfig::parse(path, &text)?;
    let tmp = path.with_extension("toml.pin-tmp");
    // The new file keeps the old one's permissions.
    let write = std::fs::write(&tmp, &text)
        .and_then(|()| std::fs::set_permissions(&tmp, std::fs::metadata(path)?.permissions()))
        .and_then(|()| std::fs::rename(&tmp, path));
    write.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        invalid(format!("cannot write {}: {e}", path.display()))
    })?;
    Ok(old)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_replaces_only_its_value() {
        let dir = std::env::temp_dir().join(format!("redoubt-pin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("redoubt.toml");
        let text = crate::cluster::tests::sample().to_toml().expect("toml");
        std::fs::write(&path, format!("# the cluster\n{text}")).expect("write");
        let pin = "ab".repeat(32);
        assert_eq!(pin_executable(&path, &pin).expect("pinned"), "");
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.starts_with("# the cluster\n"), "{text}");
        let cfg = ClusterConfig::load(&path).expect("loads");
        assert_eq!(cfg.recovery.executable_blake3, pin);
        let again = "CD".repeat(32);
        assert_eq!(pin_executable(&path, &again).expect("pinned"), pin);
        let cfg = ClusterConfig::load(&path).expect("loads");
        assert_eq!(cfg.recovery.executable_blake3, "cd".repeat(32));
        assert!(pin_executable(&path, "abc").is_err());
        assert!(pin_executable(&dir.join("none.toml"), &pin).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
