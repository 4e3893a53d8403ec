use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use dpw::cli::backend::{quiet_vulkan_probe, run_job, BackendChoice};
use dpw::cli::bench::{run_bench, BenchArgs};
use dpw::cli::change_bias::{listed_systems, output_path, set_bias, BiasMode, ChangeBiasJob};
use dpw::cli::init_logging;
use dpw::cli::neighbor_stat::{neighbor_stat, report};
use dpw::cli::test::{check_detail_prefix, TestJob};
use dpw::cli::train::{
    check_train_files, convert, freeze, run_train, wants_progress_bar, write_model, TrainArgs,
};
use dpw::dist::log::MpiLog;
use dpw::model::read_model_head;
use dpw::train::interrupt::{self, Interrupted};

/// dpw trains Deep Potential models on CPU and GPU: DeePMD-kit's se_e2_a, se_e2_r, se_e3,
/// se_e3_tebd, hybrid, se_atten/se_atten_v2 (DPA-1), DPA-2 and DPA-3 descriptors with the
/// ener, dipole, polar, dos and property fittings.
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
        /// A DeePMD-kit .yaml model or .pt training checkpoint, or a dpw model or checkpoint.
        #[arg(short, long)]
        model: PathBuf,
        /// The head (model_dict key) of a multi-task .pt checkpoint to test.
        #[arg(long)]
        head: Option<String>,
        /// A deepmd/npy system folder or a folder searched for them, a deepmd/hdf5 file or an
        /// LMDB environment (repeatable).
        #[arg(short, long = "system", required = true)]
        systems: Vec<PathBuf>,
        /// Number of frames tested per system (the first ones); 0: all of them.
        #[arg(short = 'n', long, default_value_t = 0)]
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
    /// Train a model from a DeePMD-kit input.json, like `dp train`; outputs (out.json,
    /// lcurve.out, checkpoints model.ckpt-STEP) go to the working directory. Ctrl-C or SIGTERM
    /// finishes the step, saves a checkpoint and ends the process by that signal; another one
    /// more than 2 s later stops at once.
    Train {
        /// DeePMD-kit's input.json, or the same in YAML (input.yaml, input.yml): one model (a
        /// se_e2_a, se_e2_r, se_e3, se_e3_tebd, hybrid, se_atten/se_atten_v2 (DPA-1), DPA-2 or
        /// DPA-3 descriptor), or several tasks sharing one (a multi-task input: model_dict,
        /// loss_dict, data_dict).
        input: PathBuf,
        /// Continue the run of this checkpoint (optimizer state, step and data stream included).
        #[arg(short = 'r', long, conflicts_with_all = ["init_model", "init_frz_model"])]
        restart: Option<PathBuf>,
        /// Start a new run from this checkpoint's or dpw model's parameters and statistics (for
        /// a multi-task input: the heads of a multi-task checkpoint, dpw's or a DeePMD-kit .pt).
        #[arg(short = 'i', long, conflicts_with = "init_frz_model")]
        init_model: Option<PathBuf>,
        /// Start a new run from a frozen model: DeePMD-kit's .yaml or a dpw model file.
        #[arg(short = 't', long)]
        init_frz_model: Option<PathBuf>,
        /// Fine-tune a pretrained model: a DeePMD-kit .pt training checkpoint or .yaml, or a
        /// dpw model; its weights and statistics, the energy bias re-fitted on the training
        /// data (input.json's model must be the pretrained one's).
        #[arg(long, conflicts_with_all = ["restart", "init_model", "init_frz_model"])]
        finetune: Option<PathBuf>,
        /// The head of a multi-task .pt to fine-tune from; RANDOM: its descriptor alone, with
        /// a new fitting net.
        #[arg(long, requires = "finetune")]
        model_branch: Option<String>,
        /// Take the descriptor and fitting net from the --finetune .pt's own input instead of
        /// input.json's (its type_map stays input.json's).
        #[arg(long, requires = "finetune")]
        use_pretrain_script: bool,
        /// Where to write the input with every default filled in.
        #[arg(short = 'o', long, default_value = "out.json")]
        output: PathBuf,
        /// Skip the scan of the data for neighbour counts (then sel must be numbers).
        #[arg(long)]
        skip_neighbor_stat: bool,
        /// Also write the log to this file.
        #[arg(short = 'l', long)]
        log_path: Option<PathBuf>,
        /// Under MPI: master = rank 0 logs; collect = every rank's lines, prefixed with
        /// [rank], printed by rank 0; workers = each rank prints its own (and writes its own
        /// log file FILE_rank.ext with -l).
        #[arg(short = 'm', long, value_enum, default_value = "master")]
        mpi_log: MpiLog,
        #[arg(long, value_enum, default_value = "auto")]
        backend: BackendChoice,
    },
    /// Write a self-contained model file from a training checkpoint, like `dp freeze`.
    Freeze {
        /// The checkpoint, or a folder holding `model.ckpt`.
        #[arg(short = 'c', long, default_value = ".")]
        checkpoint: PathBuf,
        /// The model file to write: DeePMD-kit's format if it ends in .yaml or .yml, else
        /// dpw's (.dpw); DeePMD-kit's other formats (.pth, .pb, ...) are refused, since `dp
        /// convert-backend` makes them from the .yaml.
        #[arg(short = 'o', long, default_value = "frozen_model.dpw")]
        output: PathBuf,
        /// The head (model_dict key or alias) of a multi-task checkpoint, as `dp freeze --head`.
        #[arg(long)]
        head: Option<String>,
    },
    /// Benchmark training: median s/step, steps/s, peak memory and start-up time of an input
    /// (no output files are kept).
    Bench {
        /// The input.json to train (default: the shipped water example).
        #[arg(default_value = "examples/water/input.json")]
        input: PathBuf,
        /// Timed steps.
        #[arg(long, default_value_t = 50)]
        steps: usize,
        /// Untimed steps first.
        #[arg(long, default_value_t = 5)]
        warmup: usize,
        #[arg(long, value_enum, default_value = "auto")]
        backend: BackendChoice,
        /// Train in float32 whatever the input's precision.
        #[arg(long)]
        float32: bool,
        /// Also write the results as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Time every backend op and report ms/step, share and GFLOP/s per op (cpu backend).
        #[arg(long)]
        profile: bool,
    },
    /// Smallest pair distance and largest neighbour count per type within rcut over some
    /// systems, like `dp neighbor-stat`.
    NeighborStat {
        /// A deepmd/npy system folder or a folder searched for them, a deepmd/hdf5 file or an
        /// LMDB environment (repeatable).
        #[arg(short, long = "system", default_value = ".")]
        systems: Vec<PathBuf>,
        /// Cut-off radius (Å).
        #[arg(short, long, default_value_t = 6.0)]
        rcut: f64,
        /// Element names in type order, e.g. `-t O H`.
        #[arg(short, long, num_args = 1.., required = true)]
        type_map: Vec<String>,
        /// Count the neighbours of all types together (one number), as se_atten's sel is.
        #[arg(long, alias = "one-type")]
        mixed_type: bool,
    },
    /// Convert a model between DeePMD-kit's .yaml and dpw's model file (by the output's
    /// extension), like `dp convert-backend`.
    #[command(alias = "convert-backend")]
    Convert {
        /// A DeePMD-kit .yaml model or .pt training checkpoint, or a dpw model or checkpoint.
        input: PathBuf,
        /// Output: `.yaml`/`.yml` for DeePMD-kit, `.dpw` (or a name no DeePMD-kit format
        /// claims) for a dpw model file.
        output: PathBuf,
        /// The head (model_dict key) of a multi-task .pt checkpoint to convert.
        #[arg(long)]
        head: Option<String>,
    },
    /// Re-fit a model's energy bias on data, or set it, like `dp change-bias`; nothing else
    /// changes.
    ChangeBias {
        /// A DeePMD-kit .pt training checkpoint or .yaml model, or a dpw model or checkpoint.
        model: PathBuf,
        /// The systems to fit on: a deepmd/npy system folder or a folder searched for them, a
        /// deepmd/hdf5 file or an LMDB environment (repeatable; default: the working folder).
        #[arg(short, long = "system", conflicts_with_all = ["datafile", "bias_value"])]
        systems: Vec<PathBuf>,
        /// A file listing the systems, one per line.
        #[arg(short = 'f', long, conflicts_with = "bias_value")]
        datafile: Option<PathBuf>,
        /// The bias itself, one value per type in the model's type_map order (eV).
        #[arg(short = 'b', long, num_args = 1.., allow_negative_numbers = true)]
        bias_value: Option<Vec<f64>>,
        /// Frames per system, the first ones (DeePMD-kit draws them at random); 0: all.
        #[arg(short = 'n', long, default_value_t = 0)]
        numb_batch: usize,
        /// change: move the bias by the fit of what the model misses of the energy labels;
        /// set: the fit of the labels alone.
        #[arg(short = 'm', long, value_enum, default_value = "change")]
        mode: BiasMode,
        /// The head (model_dict key) of a multi-task .pt checkpoint.
        #[arg(long)]
        model_branch: Option<String>,
        /// Output: `.yaml` for DeePMD-kit or a dpw model file (default: MODEL's name with
        /// `_updated`, a .pt's as .yaml).
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "auto")]
        backend: BackendChoice,
    },
}

fn main() -> ExitCode {
    let t0 = web_time::Instant::now();
    dpw::cli::heap::keep_freed_memory();
    quiet_vulkan_probe();
    let cli = Cli::parse();
    // Every command writes files: one past `ulimit -f` must be an error naming it, not a death.
    if let Err(e) = interrupt::survive_file_size_limit() {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    // Every DPW_* setting, before anything is read or written: a mistyped one costs no run.
    if let Err(e) = dpw::settings::check_all() {
        if dpw::dist::launcher_rank().unwrap_or(0) == 0 {
            eprintln!("error: {e:#}");
        }
        return ExitCode::FAILURE;
    }
    // The MPI world (training only); MPI stays initialized while `_mpi` lives.
    let _mpi = match &cli.command {
        Command::Train { .. } => match dpw::dist::init() {
            Ok(g) => Some(g),
            Err(e) => {
                // Once per job, not once per process.
                if dpw::dist::launcher_rank().unwrap_or(0) == 0 {
                    eprintln!("error: {e:#}");
                }
                return ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    // Before the log file is created: an input that cannot be read, or `-l input.json`, must
    // leave the file `-l` names as it was.
    if let Command::Train {
        input,
        restart,
        init_model,
        init_frz_model,
        output,
        log_path,
        ..
    } = &cli.command
    {
        let model = [
            ("--restart", restart),
            ("--init-model", init_model),
            ("--init-frz-model", init_frz_model),
        ]
        .into_iter()
        .find_map(|(flag, p)| Some((flag, p.as_deref()?)));
        if let Err(e) = check_train_files(input, model, output, log_path.as_deref()) {
            if dpw::dist::launcher_rank().unwrap_or(0) == 0 {
                eprintln!("error: {e:#}");
            }
            return ExitCode::FAILURE;
        }
    }
    let world = dpw::dist::world();
    let logging = match &cli.command {
        Command::Train {
            log_path, mpi_log, ..
        } => dpw::dist::log::init(log_path.as_deref(), world, *mpi_log),
        _ => init_logging(None),
    };
    if let Err(e) = logging {
        if world.is_distributed() {
            eprintln!("[{}] error: {e:#}", world.rank());
            world.abort(1);
        }
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    match run(cli.command, t0) {
        // The run is done, but the log file lacks lines (said on stderr when it happened).
        Ok(()) if dpw::cli::log_write_error().is_some() => {
            eprintln!(
                "error: {}; the log file lacks lines that are on stderr",
                dpw::cli::log_write_error().unwrap_or_default()
            );
            ExitCode::FAILURE
        }
        Ok(()) => ExitCode::SUCCESS,
        // Ctrl-C / SIGTERM: the trainer has said where its checkpoint is, and its lock files
        // went with it; the process now ends by the signal.
        Err(e) if e.downcast_ref::<Interrupted>().is_some() => {
            interrupt::end_by(e.downcast_ref::<Interrupted>().map_or(0, |i| i.signal))
        }
        // Reported by the rank that failed, or by rank 0 when all did.
        Err(e) if e.downcast_ref::<dpw::dist::Reported>().is_some() => ExitCode::FAILURE,
        // One rank's failure: it must end the whole job, or the others wait for it forever.
        Err(e) if world.is_distributed() => world.fail(&e),
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command, t0: web_time::Instant) -> anyhow::Result<()> {
    match command {
        Command::Test {
            model,
            head,
            systems,
            numb_test,
            detail_file,
            backend,
            float32,
        } => {
            if let Some(prefix) = &detail_file {
                check_detail_prefix(prefix)?;
            }
            let model = read_model_head(&model, head.as_deref())?;
            let job = TestJob {
                model,
                systems,
                nframes: numb_test,
                detail: detail_file,
            };
            let (_, report) = run_job(backend, !float32, job)?;
            print!("{report}");
        }
        Command::Train {
            input,
            restart,
            init_model,
            init_frz_model,
            finetune,
            model_branch,
            use_pretrain_script,
            output,
            skip_neighbor_stat,
            log_path: _,
            mpi_log: _,
            backend,
        } => {
            let args = TrainArgs {
                input,
                restart,
                init_model,
                init_frz_model,
                finetune,
                model_branch,
                use_pretrain_script,
                output,
                skip_neighbor_stat,
                backend,
                progress_bar: wants_progress_bar() && !dpw::dist::world().is_distributed(),
            };
            run_train(args, t0)?;
        }
        Command::Bench {
            input,
            steps,
            warmup,
            backend,
            float32,
            json,
            profile,
        } => {
            run_bench(
                BenchArgs {
                    input,
                    steps,
                    warmup,
                    backend,
                    float32,
                    json,
                    profile,
                },
                t0,
            )?;
        }
        Command::Freeze {
            checkpoint,
            output,
            head,
        } => freeze(&checkpoint, &output, head.as_deref())?,
        Command::Convert {
            input,
            output,
            head,
        } => convert(&input, &output, head.as_deref())?,
        Command::ChangeBias {
            model: input,
            systems,
            datafile,
            bias_value,
            numb_batch,
            mode,
            model_branch,
            output,
            backend,
        } => {
            let output = output_path(&input, output);
            let mut model = read_model_head(&input, model_branch.as_deref())?;
            if !model.spec.fitting.output.is_ener() {
                anyhow::bail!(
                    "{}: change-bias re-fits an energy model's bias; this model's fitting is {}",
                    input.display(),
                    model.spec.fitting.output.fitting().type_name()
                );
            }
            let report = match bias_value {
                Some(values) => set_bias(&mut model, &values)?,
                None => {
                    let systems = match datafile {
                        Some(f) => listed_systems(&f)?,
                        None if systems.is_empty() => vec![PathBuf::from(".")],
                        None => systems,
                    };
                    let job = ChangeBiasJob {
                        model,
                        systems,
                        nframes: numb_batch,
                        mode,
                    };
                    let (changed, report) = run_job(backend, true, job)?;
                    model = changed;
                    report
                }
            };
            tracing::info!("energy bias of {}: {report}", input.display());
            let what = format!("dpw change-bias {}", input.display());
            let kind = write_model(&model, &output, &what)?;
            tracing::info!("wrote the {kind} model {}", output.display());
        }
        Command::NeighborStat {
            systems,
            rcut,
            type_map,
            mixed_type,
        } => print!(
            "{}",
            report(&neighbor_stat(&systems, rcut, &type_map, mixed_type)?)
        ),
    }
    Ok(())
}
