// Command controller is cert-manager's controller (issuers, certificates, ACME orders and challenges, the
// ingress shim). It exists because upstream's command module (cmd/controller, the module
// github.com/cert-manager/cert-manager/controller-binary) is not served by the Go module proxy: this main does
// what its app.Run does, over the packages of the github.com/cert-manager/cert-manager module, with the
// flags the Helm chart passes and the ones operators reach for most (a --config file covers the rest).
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/api/resource"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	cliflag "k8s.io/component-base/cli/flag"

	config "github.com/cert-manager/cert-manager/internal/apis/config/controller"
	configscheme "github.com/cert-manager/cert-manager/internal/apis/config/controller/scheme"
	defaults "github.com/cert-manager/cert-manager/internal/apis/config/controller/v1alpha1" // registers the controllers
	"github.com/cert-manager/cert-manager/internal/apis/config/controller/validation"
	"github.com/cert-manager/cert-manager/internal/cmd/util"
	"github.com/cert-manager/cert-manager/internal/controller/feature"
	"github.com/cert-manager/cert-manager/internal/pem"
	configv1alpha1 "github.com/cert-manager/cert-manager/pkg/apis/config/controller/v1alpha1"
	"github.com/cert-manager/cert-manager/pkg/controller"
	shimgatewaycontroller "github.com/cert-manager/cert-manager/pkg/controller/certificate-shim/gateways"
	listenersetcontroller "github.com/cert-manager/cert-manager/pkg/controller/certificate-shim/listenerset"
	clusterissuerscontroller "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	controllerconfigfile "github.com/cert-manager/cert-manager/pkg/controller/configfile"
	"github.com/cert-manager/cert-manager/pkg/healthz"
	dnsutil "github.com/cert-manager/cert-manager/pkg/issuer/acme/dns/util"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/server"
	cmutil "github.com/cert-manager/cert-manager/pkg/util"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"

	// The issuer types and the controllers DefaultEnabledControllers does not import, as upstream's start.go.
	_ "github.com/cert-manager/cert-manager/pkg/controller/acmechallenges"
	_ "github.com/cert-manager/cert-manager/pkg/controller/acmeorders"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificate-shim/ingresses"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/acme"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/vault"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/venafi"

	"github.com/cert-manager/cert-manager/hami-mt-binaries/startup"
)

func main() {
	ctx, exit := util.SetupExitHandler(context.Background(), util.GracefulShutdown)
	defer exit() // may call os.Exit, so deferred first

	logf.InitLogs()
	defer logf.FlushLogs()
	ctx = logf.NewContext(ctx, logf.Log, "controller")

	if err := command(ctx, os.Args[1:]).ExecuteContext(ctx); err != nil {
		logf.Log.Error(err, "error executing command")
		util.SetExitCode(err)
	}
}

// newConfiguration is the v1alpha1 configuration with the config scheme's defaults, converted to the
// internal type the controllers read.
func newConfiguration() (*config.ControllerConfiguration, error) {
	scheme, _, err := configscheme.NewSchemeAndCodecs()
	if err != nil {
		return nil, err
	}
	versioned := &configv1alpha1.ControllerConfiguration{}
	scheme.Default(versioned)
	cfg := &config.ControllerConfiguration{}
	return cfg, scheme.Convert(versioned, cfg, nil)
}

func command(ctx context.Context, args []string) *cobra.Command {
	cfg, err := newConfiguration()
	if err != nil {
		logf.FromContext(ctx).Error(err, "cannot create the controller configuration")
		os.Exit(1)
	}
	var configFile string
	cmd := &cobra.Command{
		Use:           "controller",
		Short:         "cert-manager's controller: issues and renews the certificates its resources ask for",
		Version:       cmutil.VersionInfo().GitVersion,
		SilenceErrors: true,
		SilenceUsage:  true,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			fromFile := controllerconfigfile.New()
			return startup.Configuration{
				File:     fromFile,
				Apply:    func() { fromFile.Config.DeepCopyInto(cfg) },
				Gates:    func() map[string]bool { return cfg.FeatureGates },
				Validate: func() field.ErrorList { return validation.ValidateControllerConfiguration(cfg, nil) },
				Logging:  &cfg.Logging,
			}.PreRun(cmd, args, configFile)
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return run(cmd.Context(), cfg) },
	}
	fs := cmd.Flags()
	fs.StringVar(&configFile, "config", "", "A file with a ControllerConfiguration (controller.config.cert-manager.io/v1alpha1)")
	addFlags(fs, cfg)
	cmd.SetArgs(args)
	return cmd
}

func addFlags(fs *pflag.FlagSet, c *config.ControllerConfiguration) {
	fs.StringVar(&c.KubeConfig, "kubeconfig", c.KubeConfig, "A kubeconfig; only needed out of a cluster")
	fs.StringVar(&c.APIServerHost, "master", c.APIServerHost, "The API server's address (overrides the kubeconfig's)")
	fs.Float32Var(&c.KubernetesAPIQPS, "kube-api-qps", c.KubernetesAPIQPS, "Queries per second to the API server")
	fs.IntVar(&c.KubernetesAPIBurst, "kube-api-burst", c.KubernetesAPIBurst, "Burst of queries to the API server")
	fs.StringVar(&c.ClusterResourceNamespace, "cluster-resource-namespace", c.ClusterResourceNamespace,
		"Where the resources of cluster-scoped ones (ClusterIssuers' Secrets) live")
	fs.StringVar(&c.Namespace, "namespace", c.Namespace,
		"Watch this namespace only (ClusterIssuers are then disabled); all namespaces when empty")
	fs.BoolVar(&c.LeaderElectionConfig.Enabled, "leader-elect", c.LeaderElectionConfig.Enabled,
		"Elect a leader among replicas (a Lease); only the leader runs the controllers")
	fs.StringVar(&c.LeaderElectionConfig.Namespace, "leader-election-namespace", c.LeaderElectionConfig.Namespace,
		"The leader election Lease's namespace")
	fs.DurationVar(&c.LeaderElectionConfig.LeaseDuration, "leader-election-lease-duration",
		c.LeaderElectionConfig.LeaseDuration, "How long a leader's Lease holds without renewal")
	fs.DurationVar(&c.LeaderElectionConfig.RenewDeadline, "leader-election-renew-deadline",
		c.LeaderElectionConfig.RenewDeadline, "How long the leader keeps trying to renew before it steps down")
	fs.DurationVar(&c.LeaderElectionConfig.RetryPeriod, "leader-election-retry-period",
		c.LeaderElectionConfig.RetryPeriod, "The wait between attempts to acquire or renew the Lease")
	fs.StringSliceVar(&c.Controllers, "controllers", c.Controllers, "Controllers to enable: '*' the default ones, "+
		"'-foo' all default ones but foo, 'foo' foo alone. All: "+strings.Join(defaults.AllControllers, ", "))
	fs.StringVar(&c.ACMEHTTP01Config.SolverImage, "acme-http01-solver-image", c.ACMEHTTP01Config.SolverImage,
		"The image of ACME HTTP-01 solver pods")
	fs.StringSliceVar(&c.ACMEDNS01Config.RecursiveNameservers, "dns01-recursive-nameservers",
		c.ACMEDNS01Config.RecursiveNameservers, "DNS servers (host:port or https:// DoH) for DNS-01 self checks")
	fs.BoolVar(&c.ACMEDNS01Config.RecursiveNameserversOnly, "dns01-recursive-nameservers-only",
		c.ACMEDNS01Config.RecursiveNameserversOnly, "Ask only the recursive nameservers, never the authoritative ones")
	fs.StringVar(&c.IngressShimConfig.DefaultIssuerName, "default-issuer-name", c.IngressShimConfig.DefaultIssuerName,
		"The ingress shim's issuer when an Ingress names none")
	fs.StringVar(&c.IngressShimConfig.DefaultIssuerKind, "default-issuer-kind", c.IngressShimConfig.DefaultIssuerKind,
		"The kind of the ingress shim's default issuer")
	fs.StringVar(&c.IngressShimConfig.DefaultIssuerGroup, "default-issuer-group", c.IngressShimConfig.DefaultIssuerGroup,
		"The group of the ingress shim's default issuer")
	fs.BoolVar(&c.EnableCertificateOwnerRef, "enable-certificate-owner-ref", c.EnableCertificateOwnerRef,
		"Make each Certificate the owner of its Secret, so that deleting it deletes the Secret")
	fs.IntVar(&c.NumberOfConcurrentWorkers, "concurrent-workers", c.NumberOfConcurrentWorkers,
		"Workers of each controller")
	fs.IntVar(&c.MaxConcurrentChallenges, "max-concurrent-challenges", c.MaxConcurrentChallenges,
		"The most ACME challenges processing at once")
	fs.StringVar(&c.MetricsListenAddress, "metrics-listen-address", c.MetricsListenAddress,
		"Where the Prometheus metrics are served")
	fs.StringVar(&c.HealthzListenAddress, "healthz-listen-address", c.HealthzListenAddress,
		"Where /livez is served (the chart's liveness probe)")
	fs.StringVar(&c.HealthzListenAddress, "internal-healthz-listen-address", c.HealthzListenAddress,
		"Upstream's (hidden) name of --healthz-listen-address")
	utilruntime.Must(fs.MarkHidden("internal-healthz-listen-address"))
	fs.BoolVar(&c.GatewayAPIConfig.Enabled, "enable-gateway-api", c.GatewayAPIConfig.Enabled,
		"Issue certificates for Gateway API Gateways (with the ExperimentalGatewayAPISupport gate)")
	fs.BoolVar(&c.GatewayAPIConfig.EnableListenerSet, "enable-gateway-api-listenerset",
		c.GatewayAPIConfig.EnableListenerSet, "And for ListenerSets (with the ListenerSets gate)")
	fs.Var(cliflag.NewMapStringBool(&c.FeatureGates), "feature-gates", "key=value pairs of feature gates: "+
		strings.Join(utilfeature.DefaultFeatureGate.KnownFeatures(), "; "))
	logf.AddFlags(&c.Logging, fs) // --v, --logging-format, ...
}

// enabledControllers reads --controllers as upstream does: "*" the defaults, "-foo" removes foo.
func enabledControllers(c *config.ControllerConfiguration) sets.Set[string] {
	enabled, disabled := sets.New[string](), []string{}
	for _, name := range c.Controllers {
		switch {
		case name == "*":
			enabled.Insert(defaults.DefaultEnabledControllers...)
		case strings.HasPrefix(name, "-"):
			disabled = append(disabled, strings.TrimPrefix(name, "-"))
		default:
			enabled.Insert(name)
		}
	}
	if len(disabled) > 0 && enabled.Len() == 0 {
		enabled.Insert(defaults.DefaultEnabledControllers...)
	}
	if utilfeature.DefaultFeatureGate.Enabled(feature.ExperimentalCertificateSigningRequestControllers) {
		enabled.Insert(defaults.ExperimentalCertificateSigningRequestControllers...)
	}
	gateway := gatewayAPI(c)
	if gateway {
		enabled.Insert(shimgatewaycontroller.ControllerName)
	}
	if gateway && c.GatewayAPIConfig.EnableListenerSet && utilfeature.DefaultFeatureGate.Enabled(feature.ListenerSets) {
		enabled.Insert(listenersetcontroller.ControllerName)
	}
	if c.Namespace != "" {
		enabled.Delete(defaults.ClusterScopedControllers...)
	}
	return enabled.Delete(disabled...)
}

func gatewayAPI(c *config.ControllerConfiguration) bool {
	return c.GatewayAPIConfig.Enabled && utilfeature.DefaultFeatureGate.Enabled(feature.ExperimentalGatewayAPISupport)
}

func contextFactory(ctx context.Context, c *config.ControllerConfiguration) (*controller.ContextFactory, error) {
	nameservers := c.ACMEDNS01Config.RecursiveNameservers
	if len(nameservers) == 0 {
		nameservers = dnsutil.RecursiveNameservers
	}
	quantities := map[string]resource.Quantity{}
	for name, value := range map[string]string{
		"acme-http01-solver-resource-request-cpu":    c.ACMEHTTP01Config.SolverResourceRequestCPU,
		"acme-http01-solver-resource-request-memory": c.ACMEHTTP01Config.SolverResourceRequestMemory,
		"acme-http01-solver-resource-limits-cpu":     c.ACMEHTTP01Config.SolverResourceLimitsCPU,
		"acme-http01-solver-resource-limits-memory":  c.ACMEHTTP01Config.SolverResourceLimitsMemory,
	} {
		q, err := resource.ParseQuantity(value)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		quantities[name] = q
	}
	return controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig:         c.KubeConfig,
		KubernetesAPIQPS:   c.KubernetesAPIQPS,
		KubernetesAPIBurst: c.KubernetesAPIBurst,
		APIServerHost:      c.APIServerHost,
		Namespace:          c.Namespace,
		ACMEOptions: controller.ACMEOptions{
			HTTP01SolverResourceRequestCPU:    quantities["acme-http01-solver-resource-request-cpu"],
			HTTP01SolverResourceRequestMemory: quantities["acme-http01-solver-resource-request-memory"],
			HTTP01SolverResourceLimitsCPU:     quantities["acme-http01-solver-resource-limits-cpu"],
			HTTP01SolverResourceLimitsMemory:  quantities["acme-http01-solver-resource-limits-memory"],
			ACMEHTTP01SolverRunAsNonRoot:      c.ACMEHTTP01Config.SolverRunAsNonRoot,
			HTTP01SolverImage:                 c.ACMEHTTP01Config.SolverImage,
			HTTP01SolverNameservers:           c.ACMEHTTP01Config.SolverNameservers,
			HTTP01SolverExtraLabels:           c.ACMEHTTP01Config.SolverExtraLabels,
			HTTP01SolverRuntimeClassName:      c.ACMEHTTP01Config.SolverRuntimeClassName,
			DNS01Nameservers:                  nameservers,
			DNS01CheckRetryPeriod:             c.ACMEDNS01Config.CheckRetryPeriod,
			DNS01CheckAuthoritative:           !c.ACMEDNS01Config.RecursiveNameserversOnly,
		},
		SchedulerOptions: controller.SchedulerOptions{MaxConcurrentChallenges: c.MaxConcurrentChallenges},
		IssuerOptions: controller.IssuerOptions{
			ClusterIssuerAmbientCredentials: c.ClusterIssuerAmbientCredentials,
			IssuerAmbientCredentials:        c.IssuerAmbientCredentials,
			ClusterResourceNamespace:        c.ClusterResourceNamespace,
		},
		IngressShimOptions: controller.IngressShimOptions{
			DefaultIssuerName:                 c.IngressShimConfig.DefaultIssuerName,
			DefaultIssuerKind:                 c.IngressShimConfig.DefaultIssuerKind,
			DefaultIssuerGroup:                c.IngressShimConfig.DefaultIssuerGroup,
			DefaultAutoCertificateAnnotations: c.IngressShimConfig.DefaultAutoCertificateAnnotations,
			ExtraCertificateAnnotations:       c.IngressShimConfig.ExtraCertificateAnnotations,
			GatewayAPIExtraProtocols:          sets.New[string](c.GatewayAPIConfig.ExtraProtocols...),
		},
		CertificateOptions: controller.CertificateOptions{
			EnableOwnerRef:                           c.EnableCertificateOwnerRef,
			CopiedAnnotationPrefixes:                 c.CopiedAnnotationPrefixes,
			CertificateRequestMinimumBackoffDuration: c.CertificateRequestMinimumBackoffDuration,
			CertificateRequestMaximumBackoffDuration: c.CertificateRequestMaximumBackoffDuration,
		},
		ConfigOptions: controller.ConfigOptions{
			EnableGatewayAPI:            c.GatewayAPIConfig.Enabled,
			EnableGatewayAPIListenerSet: c.GatewayAPIConfig.EnableListenerSet,
		},
	})
}

func run(rootCtx context.Context, c *config.ControllerConfiguration) error {
	rootCtx, cancel := context.WithCancel(rootCtx)
	defer cancel()
	log := logf.FromContext(rootCtx)
	g, rootCtx := errgroup.WithContext(rootCtx)
	v := cmutil.VersionInfo()
	log.Info("starting cert-manager controller", "version", v.GitVersion, "git_commit", v.GitCommit,
		"go_version", v.GoVersion, "platform", v.Platform)

	factory, err := contextFactory(rootCtx, c)
	if err != nil {
		return err
	}
	ctx, err := factory.Build()
	if err != nil {
		return err
	}
	limits := c.PEMSizeLimitsConfig
	pem.SetGlobalSizeLimits(pem.NewSizeLimitsFromConfig(limits.MaxCertificateSize, limits.MaxPrivateKeySize,
		limits.MaxChainLength, limits.MaxBundleSize))
	enabled := enabledControllers(c)
	log.Info("enabled controllers: " + strings.Join(sets.List(enabled), ", "))

	// Metrics (plain HTTP: the chart's default) and /livez, as upstream serves them.
	metricsLn, err := server.Listen(rootCtx, "tcp", c.MetricsListenAddress)
	if err != nil {
		return fmt.Errorf("metrics address %s: %w", c.MetricsListenAddress, err)
	}
	informers := ctx.SharedInformerFactory.Certmanager().V1()
	ctx.Metrics.SetupACMECollector(ctx.SharedInformerFactory.Acme().V1().Challenges().Lister())
	ctx.Metrics.SetupCertificateCollector(informers.Certificates().Lister())
	ctx.Metrics.SetupIssuerCollector(informers.Issuers().Lister())
	if enabled.Has(clusterissuerscontroller.ControllerName) {
		ctx.Metrics.SetupClusterIssuerCollector(informers.ClusterIssuers().Lister())
	}
	metricsServer := ctx.Metrics.NewServer(metricsLn)
	g.Go(func() error {
		<-rootCtx.Done()
		shutdownCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
		defer done()
		return metricsServer.Shutdown(shutdownCtx) //nolint:contextcheck // the root context is done
	})
	g.Go(func() error {
		if err := metricsServer.Serve(metricsLn); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	healthzLn, err := (&net.ListenConfig{}).Listen(rootCtx, "tcp", c.HealthzListenAddress)
	if err != nil {
		return fmt.Errorf("healthz address %s: %w", c.HealthzListenAddress, err)
	}
	healthzServer := healthz.NewServer(c.LeaderElectionConfig.HealthzTimeout)
	g.Go(func() error { return healthzServer.Start(rootCtx, healthzLn) })

	elected := make(chan struct{})
	if c.LeaderElectionConfig.Enabled {
		g.Go(func() error { return leaderElection(rootCtx, c, factory, healthzServer, elected) })
	} else {
		close(elected)
	}
	select {
	case <-rootCtx.Done():
		return g.Wait()
	case <-elected:
	}

	for name, constructor := range controller.Known() {
		if !enabled.Has(name) {
			continue
		}
		iface, err := constructor(factory)
		if err != nil {
			cancel()
			return errors.Join(fmt.Errorf("controller %s: %w", name, err), g.Wait())
		}
		g.Go(func() error {
			log.V(logf.InfoLevel).Info("starting controller", "controller", name)
			return iface.Run(c.NumberOfConcurrentWorkers, rootCtx)
		})
	}
	ctx.SharedInformerFactory.Start(rootCtx.Done())
	ctx.KubeSharedInformerFactory.Start(rootCtx.Done())
	ctx.HTTP01ResourceMetadataInformersFactory.Start(rootCtx.Done())
	if gatewayAPI(c) {
		ctx.GWShared.Start(rootCtx.Done())
		defer ctx.GWShared.Shutdown()
	}

	if err := g.Wait(); err != nil {
		return err
	}
	log.Info("control loops exited")
	ctx.HTTP01ResourceMetadataInformersFactory.Shutdown()
	ctx.KubeSharedInformerFactory.Shutdown()
	ctx.SharedInformerFactory.Shutdown()
	return nil
}

// leaderElection holds the Lease cert-manager-controller in the leader election namespace, as upstream
// does, closing elected once it leads; losing the Lease is an error, so the process exits.
func leaderElection(ctx context.Context, c *config.ControllerConfiguration, factory *controller.ContextFactory,
	healthzServer *healthz.Server, elected chan struct{}) error {
	leCtx, err := factory.Build("leader-election")
	if err != nil {
		return err
	}
	id, err := os.Hostname()
	if err != nil {
		return err
	}
	lock, err := resourcelock.NewWithLabels(resourcelock.LeasesResourceLock, c.LeaderElectionConfig.Namespace,
		"cert-manager-controller", leCtx.Client.CoreV1(), leCtx.Client.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: id + "-external-cert-manager-controller", EventRecorder: leCtx.Recorder},
		map[string]string{"app.kubernetes.io/managed-by": "cert-manager"})
	if err != nil {
		return fmt.Errorf("leader election lock: %w", err)
	}
	lost := make(chan error, 1)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   c.LeaderElectionConfig.LeaseDuration,
		RenewDeadline:   c.LeaderElectionConfig.RenewDeadline,
		RetryPeriod:     c.LeaderElectionConfig.RetryPeriod,
		ReleaseOnCancel: true,
		WatchDog:        healthzServer.LeaderHealthzAdaptor,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { close(elected) },
			OnStoppedLeading: func() {
				if ctx.Err() == nil {
					lost <- errors.New("leader election lost")
				}
			},
		},
	})
	if err != nil {
		return err
	}
	le.Run(ctx)
	select {
	case err := <-lost:
		return err
	default:
		return nil
	}
}
