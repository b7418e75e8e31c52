// Command hami-webhook serves HAMi's admission webhook alone, as HAMi's scheduler binary serves it
// (cmd/scheduler: an httprouter with routes.WebHookRoute() on POST /webhook, a certwatcher over the
// TLS pair, the same http.Server timeouts), without the extender or its node and pod informers.
//
// It is not part of hami-mt-webhook: devtools.clusters.hami builds it against a HAMi source tree, with that
// tree's own go.mod, for the benchmark's `peers` part. The device configuration is HAMi's file
// format (--device-config-file), so HAMi's webhook sees the resource names HAMi's chart gives it.
package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/julienschmidt/httprouter"
	klog "k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"

	"github.com/Project-HAMi/HAMi/pkg/scheduler/config"
	"github.com/Project-HAMi/HAMi/pkg/scheduler/routes"
)

func main() {
	fs := config.GlobalFlagSet() // --device-config-file, the device flags and klog's
	fs.StringVar(&config.HTTPBind, "http_bind", "127.0.0.1:9443", "address to serve HTTPS on")
	fs.StringVar(&config.SchedulerName, "scheduler-name", "hami-scheduler",
		"the schedulerName HAMi's webhook gives the pods it takes")
	fs.BoolVar(&config.ForceOverwriteDefaultScheduler, "force-overwrite-default-scheduler", true,
		"take pods on default-scheduler too, as HAMi's scheduler binary does by default")
	certFile := fs.String("cert_file", "", "TLS certificate (PEM)")
	keyFile := fs.String("key_file", "", "TLS private key (PEM)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *certFile == "" || *keyFile == "" {
		fmt.Fprintln(os.Stderr, "hami-webhook: --cert_file and --key_file are required")
		os.Exit(2)
	}
	if err := serve(*certFile, *keyFile); err != nil {
		fmt.Fprintln(os.Stderr, "hami-webhook:", err)
		os.Exit(1)
	}
}

func serve(certFile, keyFile string) error {
	config.InitDevices()
	router := httprouter.New()
	router.POST("/webhook", routes.WebHookRoute())
	router.GET("/healthz", routes.HealthzRoute())

	watcher, err := certwatcher.New(certFile, keyFile)
	if err != nil {
		return fmt.Errorf("cert watcher: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		if err := watcher.Start(ctx); err != nil && err != context.Canceled {
			klog.ErrorS(err, "cert watcher error")
		}
	}()
	server := &http.Server{
		Addr:              config.HTTPBind,
		Handler:           router,
		TLSConfig:         &tls.Config{GetCertificate: watcher.GetCertificate},
		ReadHeaderTimeout: 15 * time.Second,
		ReadTimeout:       60 * time.Second,
	}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(shutdown)
	}()
	listener, err := net.Listen("tcp", config.HTTPBind)
	if err != nil {
		return err
	}
	klog.InfoS("Starting HTTPS server", "address", config.HTTPBind)
	fmt.Println("ready") // the port is bound: the caller may connect
	if err := server.ServeTLS(listener, "", ""); err != nil && err != http.ErrServerClosed {
		return err
	}
	return nil
}
