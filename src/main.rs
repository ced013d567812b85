//! The stock `artex` binary: the CLI with the stock task kinds.
fn main() -> std::process::ExitCode {
    artex::cli::main_with(artex::handlers::stock())
}
