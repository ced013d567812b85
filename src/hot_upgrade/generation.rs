//! Generation folders: an upgrade unpacks each new build into a folder of its own under
//! the upgrade folder, marked as a generation; the generation that runs from it removes
//! it when it exits (Linux keeps the running binary alive until then).

/// The marker file that makes an upgrade's folder a generation folder.
pub const GENERATION_MARKER: &str = ".artex-generation";

/// Removes the folder this process's binary runs from, if an upgrade unpacked it there;
/// called once the process is done (drained or stopped).
pub fn remove_own_generation() {
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with("gen-") && dir.join(GENERATION_MARKER).exists() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}
