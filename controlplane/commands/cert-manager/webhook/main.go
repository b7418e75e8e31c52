// Command webhook is cert-manager's webhook (API validation, mutation and conversion for its resources):
// the same flags, configuration file and server as the upstream command, over the packages of the
// github.com/cert-manager/cert-manager module.
package main

import (
	"context"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cert-manager/cert-manager/internal/apis/config/webhook/validation"
	"github.com/cert-manager/cert-manager/internal/cmd/util"
	cmwebhook "github.com/cert-manager/cert-manager/internal/webhook"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	cmutil "github.com/cert-manager/cert-manager/pkg/util"
	webhookconfigfile "github.com/cert-manager/cert-manager/pkg/webhook/configfile"
	"github.com/cert-manager/cert-manager/pkg/webhook/options"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/cert-manager/cert-manager/hami-mt-binaries/startup"
)

func main() {
	ctx, exit := util.SetupExitHandler(context.Background(), util.GracefulShutdown)
	defer exit() // may call os.Exit, so deferred first

	logf.InitLogs()
	defer logf.FlushLogs()
	ctrl.SetLogger(logf.Log)
	ctx = logf.NewContext(ctx, logf.Log, "webhook")

	if err := command(ctx, os.Args[1:]).ExecuteContext(ctx); err != nil {
		logf.Log.Error(err, "error executing command")
		util.SetExitCode(err)
	}
}

func command(ctx context.Context, args []string) *cobra.Command {
	flags := options.NewWebhookFlags()
	cfg, err := options.NewWebhookConfiguration()
	if err != nil {
		logf.FromContext(ctx).Error(err, "cannot create the webhook configuration")
		os.Exit(1)
	}
	cmd := &cobra.Command{
		Use:           "webhook",
		Short:         "cert-manager's webhook: validation, mutation and conversion of its resources",
		Version:       cmutil.VersionInfo().GitVersion,
		SilenceErrors: true,
		SilenceUsage:  true,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			fromFile := webhookconfigfile.New()
			return startup.Configuration{
				File:     fromFile,
				Apply:    func() { fromFile.Config.DeepCopyInto(cfg) },
				Gates:    func() map[string]bool { return cfg.FeatureGates },
				Validate: func() field.ErrorList { return validation.ValidateWebhookConfiguration(cfg, nil) },
				Logging:  &cfg.Logging,
			}.PreRun(cmd, args, flags.Config)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := logf.FromContext(cmd.Context(), "webhook")
			v := cmutil.VersionInfo()
			log.Info("starting cert-manager webhook", "version", v.GitVersion, "git_commit", v.GitCommit,
				"go_version", v.GoVersion, "platform", v.Platform)
			srv, err := cmwebhook.NewCertManagerWebhookServer(log, *cfg)
			if err != nil {
				return err
			}
			return srv.Run(cmd.Context())
		},
	}
	flags.AddFlags(cmd.Flags())
	options.AddConfigFlags(cmd.Flags(), cfg)
	cmd.SetArgs(args)
	return cmd
}
