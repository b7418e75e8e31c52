// Command cainjector is cert-manager's CA injector: it copies the CA of a Certificate (or Secret) into the
// webhook configurations, CRDs and APIServices annotated to ask for it. It exists because upstream's command
// module (cmd/cainjector, the module github.com/cert-manager/cert-manager/cainjector-binary) is not served by
// the Go module proxy: this main does what its app.Run does with controller-runtime, over the packages of the
// github.com/cert-manager/cert-manager module, with the flags the Helm chart passes and a --config file.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apiext "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	kscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	cliflag "k8s.io/component-base/cli/flag"
	apireg "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	config "github.com/cert-manager/cert-manager/internal/apis/config/cainjector"
	configscheme "github.com/cert-manager/cert-manager/internal/apis/config/cainjector/scheme"
	"github.com/cert-manager/cert-manager/internal/apis/config/cainjector/validation"
	"github.com/cert-manager/cert-manager/internal/cmd/util"
	configv1alpha1 "github.com/cert-manager/cert-manager/pkg/apis/config/cainjector/v1alpha1"
	cainjectorconfigfile "github.com/cert-manager/cert-manager/pkg/cainjector/configfile"
	cmscheme "github.com/cert-manager/cert-manager/pkg/client/clientset/versioned/scheme"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	cmutil "github.com/cert-manager/cert-manager/pkg/util"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"

	"github.com/cert-manager/cert-manager/hami-mt-binaries/startup"
)

func main() {
	ctx, exit := util.SetupExitHandler(context.Background(), util.GracefulShutdown)
	defer exit() // may call os.Exit, so deferred first

	logf.InitLogs()
	defer logf.FlushLogs()
	ctrl.SetLogger(logf.Log)
	ctx = logf.NewContext(ctx, logf.Log, "cainjector")

	if err := command(ctx, os.Args[1:]).ExecuteContext(ctx); err != nil {
		logf.Log.Error(err, "error executing command")
		util.SetExitCode(err)
	}
}

func command(ctx context.Context, args []string) *cobra.Command {
	scheme, _, err := configscheme.NewSchemeAndCodecs()
	cfg := &config.CAInjectorConfiguration{}
	if err == nil {
		versioned := &configv1alpha1.CAInjectorConfiguration{}
		scheme.Default(versioned)
		err = scheme.Convert(versioned, cfg, nil)
	}
	if err != nil {
		logf.FromContext(ctx).Error(err, "cannot create the cainjector configuration")
		os.Exit(1)
	}
	var configFile string
	cmd := &cobra.Command{
		Use:           "cainjector",
		Short:         "cert-manager's CA injector: CA bundles into webhook configurations, CRDs and APIServices",
		Version:       cmutil.VersionInfo().GitVersion,
		SilenceErrors: true,
		SilenceUsage:  true,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			fromFile := cainjectorconfigfile.New()
			return startup.Configuration{
				File:     fromFile,
				Apply:    func() { fromFile.Config.DeepCopyInto(cfg) },
				Gates:    func() map[string]bool { return cfg.FeatureGates },
				Validate: func() field.ErrorList { return validation.ValidateCAInjectorConfiguration(cfg, nil) },
				Logging:  &cfg.Logging,
			}.PreRun(cmd, args, configFile)
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return run(cmd.Context(), cfg) },
	}
	fs, c := cmd.Flags(), cfg
	fs.StringVar(&configFile, "config", "", "A file with a CAInjectorConfiguration (cainjector.config.cert-manager.io/v1alpha1)")
	fs.StringVar(&c.KubeConfig, "kubeconfig", c.KubeConfig, "A kubeconfig; only needed out of a cluster")
	fs.StringVar(&c.Namespace, "namespace", c.Namespace, "Inject into resources of this namespace only")
	fs.StringSliceVar(&c.IgnoreNamespaces, "ignore-namespaces", c.IgnoreNamespaces, "Namespaces whose Secrets are ignored")
	fs.BoolVar(&c.LeaderElectionConfig.Enabled, "leader-elect", c.LeaderElectionConfig.Enabled,
		"Elect a leader among replicas (a Lease); only the leader injects")
	fs.StringVar(&c.LeaderElectionConfig.Namespace, "leader-election-namespace", c.LeaderElectionConfig.Namespace,
		"The leader election Lease's namespace")
	fs.DurationVar(&c.LeaderElectionConfig.LeaseDuration, "leader-election-lease-duration",
		c.LeaderElectionConfig.LeaseDuration, "How long a leader's Lease holds without renewal")
	fs.DurationVar(&c.LeaderElectionConfig.RenewDeadline, "leader-election-renew-deadline",
		c.LeaderElectionConfig.RenewDeadline, "How long the leader keeps trying to renew before it steps down")
	fs.DurationVar(&c.LeaderElectionConfig.RetryPeriod, "leader-election-retry-period",
		c.LeaderElectionConfig.RetryPeriod, "The wait between attempts to acquire or renew the Lease")
	fs.BoolVar(&c.EnableDataSourceConfig.Certificates, "enable-certificates-data-source",
		c.EnableDataSourceConfig.Certificates, "Read CAs from Certificates (cert-manager.io/inject-ca-from)")
	fs.BoolVar(&c.EnableInjectableConfig.ValidatingWebhookConfigurations, "enable-validatingwebhookconfigurations-injectable",
		c.EnableInjectableConfig.ValidatingWebhookConfigurations, "Inject into ValidatingWebhookConfigurations")
	fs.BoolVar(&c.EnableInjectableConfig.MutatingWebhookConfigurations, "enable-mutatingwebhookconfigurations-injectable",
		c.EnableInjectableConfig.MutatingWebhookConfigurations, "Inject into MutatingWebhookConfigurations")
	fs.BoolVar(&c.EnableInjectableConfig.CustomResourceDefinitions, "enable-customresourcedefinitions-injectable",
		c.EnableInjectableConfig.CustomResourceDefinitions, "Inject into CustomResourceDefinitions")
	fs.BoolVar(&c.EnableInjectableConfig.APIServices, "enable-apiservices-injectable",
		c.EnableInjectableConfig.APIServices, "Inject into APIServices")
	fs.StringVar(&c.MetricsListenAddress, "metrics-listen-address", c.MetricsListenAddress,
		"Where the Prometheus metrics are served; 0 serves none")
	fs.Var(cliflag.NewMapStringBool(&c.FeatureGates), "feature-gates", "key=value pairs of feature gates: "+
		strings.Join(utilfeature.DefaultFeatureGate.KnownFeatures(), "; "))
	logf.AddFlags(&c.Logging, fs) // --v, --logging-format, ...
	cmd.SetArgs(args)
	return cmd
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrl.GetConfig() // $KUBECONFIG, else in-cluster
}

func run(ctx context.Context, c *config.CAInjectorConfiguration) error {
	log := logf.FromContext(ctx)
	v := cmutil.VersionInfo()
	log.Info("starting cert-manager ca-injector", "version", v.GitVersion, "git_commit", v.GitCommit,
		"go_version", v.GoVersion, "platform", v.Platform)
	restCfg, err := restConfig(c.KubeConfig)
	if err != nil {
		return err
	}
	restCfg = cmutil.RestConfigWithUserAgent(restCfg, "cainjector")

	scheme := runtime.NewScheme()
	utilruntime.Must(kscheme.AddToScheme(scheme))
	utilruntime.Must(cmscheme.AddToScheme(scheme))
	utilruntime.Must(apiext.AddToScheme(scheme))
	utilruntime.Must(apireg.AddToScheme(scheme))

	var namespaces map[string]cache.Config
	if c.Namespace != "" {
		namespaces = map[string]cache.Config{c.Namespace: {}}
	}
	le := c.LeaderElectionConfig
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme: scheme,
		Cache:  cache.Options{ReaderFailOnMissingInformer: true, DefaultNamespaces: namespaces},
		// Secrets are read from the API server each time, never cached: a cluster's Secrets can be many
		// and large (upstream's reason).
		Client:                        client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		LeaderElection:                le.Enabled,
		LeaderElectionNamespace:       le.Namespace,
		LeaderElectionID:              "cert-manager-cainjector-leader-election",
		LeaderElectionReleaseOnCancel: true,
		LeaderElectionLabels:          map[string]string{"app.kubernetes.io/managed-by": "cert-manager-cainjector"},
		LeaderElectionResourceLock:    resourcelock.LeasesResourceLock,
		LeaseDuration:                 &le.LeaseDuration,
		RenewDeadline:                 &le.RenewDeadline,
		RetryPeriod:                   &le.RetryPeriod,
		Metrics:                       metricsserver.Options{BindAddress: c.MetricsListenAddress},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}

	if c.EnableDataSourceConfig.Certificates {
		// As upstream: wait (up to 5 minutes) for the Certificate CRD the data source watches.
		direct, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
		if err != nil {
			return err
		}
		err = wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
			err := direct.Get(ctx, types.NamespacedName{Name: "certificates.cert-manager.io"}, &apiext.CustomResourceDefinition{})
			if apierrors.IsNotFound(err) {
				log.Info("waiting for the CRD certificates.cert-manager.io")
				return false, nil
			}
			return err == nil, err
		})
		if err != nil {
			return fmt.Errorf("the CRD certificates.cert-manager.io: %w", err)
		}
	}

	err = cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		Namespace:                    c.Namespace,
		IgnoreNamespaces:             c.IgnoreNamespaces,
		EnableCertificatesDataSource: c.EnableDataSourceConfig.Certificates,
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName:   c.EnableInjectableConfig.MutatingWebhookConfigurations,
			cainjector.ValidatingWebhookConfigurationName: c.EnableInjectableConfig.ValidatingWebhookConfigurations,
			cainjector.APIServiceName:                     c.EnableInjectableConfig.APIServices,
			cainjector.CustomResourceDefinitionName:       c.EnableInjectableConfig.CustomResourceDefinitions,
		},
	})
	if err != nil {
		return fmt.Errorf("registering the injectors: %w", err)
	}
	return mgr.Start(ctx)
}
