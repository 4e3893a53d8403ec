use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use dpw::cli::backend::{run_job, BackendChoice};
use dpw::cli::test::TestJob;
use dpw::cli::{init_logging, load_model};

/// dpw trains Deep Potential models (DeePMD-kit se_e2_a + ener) on CPU and GPU.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Test a model on labelled systems, like `dp test`.
    Test {
        /// A DeePMD-kit .yaml model, or a dpw model or checkpoint.
        #[arg(short, long)]
        model: PathBuf,
        /// A deepmd/npy system folder (repeatable).
        #[arg(short, long = "system", required = true)]
        systems: Vec<PathBuf>,
        /// Number of frames tested per system (the first ones).
        #[arg(short = 'n', long, default_value_t = 100)]
        numb_test: usize,
        /// Write PREFIX.e.out, .e_peratom.out, .f.out, .v.out, .v_peratom.out.
        #[arg(short = 'd', long)]
        detail_file: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "auto")]
        backend: BackendChoice,
        /// Evaluate in float32 instead of float64.
        #[arg(long)]
        float32: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(None) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Test {
            model,
            systems,
            numb_test,
            detail_file,
            backend,
            float32,
        } => {
            let model = load_model(&model)?;
            let job = TestJob {
                model,
                systems,
                nframes: numb_test,
                detail: detail_file,
            };
            let (_, report) = run_job(backend, !float32, job)?;
            print!("{report}");
        }
    }
    Ok(())
}
