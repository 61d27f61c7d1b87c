package kubepool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/fleet"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// Config configures a Watcher.
type Config struct {
	// PoolName and PoolNamespace name the InferencePool (GIE's --pool-name
	// and --pool-namespace). Both are required.
	PoolName, PoolNamespace string
	// REST reaches the API server (RESTConfig builds it).
	REST *rest.Config
	// Defaults fill what pod annotations do not say.
	Defaults Defaults
	// ProbeInterval is how often the API server is asked for its version
	// (default 1 s), so that an outage of an idle watch is noticed.
	ProbeInterval time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// RESTConfig returns the in-cluster configuration when kubeconfig is
// empty, else the current context of that kubeconfig file.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes in-cluster config (outside a cluster, give --kubeconfig): %w", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.UserAgent = "kvroute"
	// Informers list once and then watch; the default 5 QPS only slows the
	// first list of a large namespace.
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

// Validate reports the settings that cannot work.
func (c Config) Validate() error {
	var errs []error
	if c.PoolName == "" {
		errs = append(errs, errors.New("pool name is empty"))
	}
	if c.PoolNamespace == "" {
		errs = append(errs, errors.New("pool namespace is empty"))
	}
	if c.REST == nil {
		errs = append(errs, errors.New("no API server configuration"))
	}
	if c.ProbeInterval < 0 {
		errs = append(errs, fmt.Errorf("probe interval %v must not be negative", c.ProbeInterval))
	}
	if len(errs) > 0 {
		return fmt.Errorf("inferencepool discovery: %w", errors.Join(errs...))
	}
	return nil
}

// Watcher mirrors an InferencePool's Ready pods into a Sink. The informers
// retry on their own while the API server is away and keep the last known
// pods; a failed list or watch and a probe of GET /version tell the
// Observer whether it answers.
type Watcher struct {
	cfg    Config
	log    *slog.Logger
	dyn    dynamic.Interface
	kube   kubernetes.Interface
	synced chan struct{}

	// Set by Run before the informers start.
	sink fleet.Sink
	obs  discovery.Observer

	mu    sync.Mutex // serialises the two informers' handlers
	spec  *Spec      // nil: no (valid) pool
	pods  listersv1.PodLister
	known map[string][]fleet.Worker // pod name → its workers in the Sink
}

// New checks cfg and builds the clients; Run starts watching.
func New(cfg Config) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	dyn, err := dynamic.NewForConfig(cfg.REST)
	if err != nil {
		return nil, fmt.Errorf("inferencepool discovery: %w", err)
	}
	kube, err := kubernetes.NewForConfig(cfg.REST)
	if err != nil {
		return nil, fmt.Errorf("inferencepool discovery: %w", err)
	}
	return &Watcher{
		cfg: cfg, log: cfg.Logger.With("inferencepool", cfg.PoolNamespace+"/"+cfg.PoolName),
		dyn: dyn, kube: kube, synced: make(chan struct{}), known: map[string][]fleet.Worker{},
	}, nil
}

var _ discovery.Source = (*Watcher)(nil)

// Synced is closed once both informers have listed and every pod then
// known has been applied to the Sink.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// FlapGrace is zero: a pod deleted or no longer Ready is gone.
func (*Watcher) FlapGrace() time.Duration { return 0 }

// Run watches until ctx ends and returns ctx's error. A pod that cannot be
// turned into workers goes to obs.BadRecord (it then serves nothing).
func (w *Watcher) Run(ctx context.Context, sink fleet.Sink, obs discovery.Observer) error {
	if obs == nil {
		obs = discovery.NopObserver{}
	}
	w.mu.Lock()
	w.sink, w.obs = sink, obs
	w.mu.Unlock()
	poolF := dynamicinformer.NewFilteredDynamicSharedInformerFactory(w.dyn, 0, w.cfg.PoolNamespace,
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", w.cfg.PoolName).String()
		})
	poolInf := poolF.ForResource(PoolGVR).Informer()
	podF := informers.NewSharedInformerFactoryWithOptions(w.kube, 0, informers.WithNamespace(w.cfg.PoolNamespace))
	podInf := podF.Core().V1().Pods()
	w.mu.Lock()
	w.pods = podInf.Lister()
	w.mu.Unlock()

	if _, err := poolInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.poolChanged(o) },
		UpdateFunc: func(_, o any) { w.poolChanged(o) },
		DeleteFunc: func(any) { w.setSpec(nil, "InferencePool deleted") },
	}); err != nil {
		return fmt.Errorf("inferencepool discovery: %w", err)
	}
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.podChanged(o) },
		UpdateFunc: func(_, o any) { w.podChanged(o) },
		DeleteFunc: func(o any) { w.podDeleted(o) },
	}); err != nil {
		return fmt.Errorf("inferencepool discovery: %w", err)
	}
	h := discovery.NewReachability(obs)
	onErr := func(_ *cache.Reflector, err error) { h.Set(err) }
	_ = poolInf.SetWatchErrorHandler(onErr)
	_ = podInf.Informer().SetWatchErrorHandler(onErr)
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		every := w.cfg.ProbeInterval
		discovery.Probe(ctx, h, every, every, w.probe)
	}()
	defer func() { <-probed }()
	poolF.Start(ctx.Done())
	podF.Start(ctx.Done())
	start := time.Now()
	if !cache.WaitForCacheSync(ctx.Done(), poolInf.HasSynced, podInf.Informer().HasSynced) {
		poolF.Shutdown()
		podF.Shutdown()
		return ctx.Err()
	}
	// Handlers run on their own goroutines; apply everything listed so far
	// once more under the lock so Synced means "the Sink holds the fleet".
	w.resyncAll()
	w.log.Info("inferencepool synced", "workers", w.Workers(), "took", time.Since(start).Round(time.Millisecond))
	close(w.synced)
	<-ctx.Done()
	poolF.Shutdown()
	podF.Shutdown()
	return ctx.Err()
}

// Workers counts the workers currently in the Sink.
func (w *Watcher) Workers() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, ws := range w.known {
		n += len(ws)
	}
	return n
}

func (w *Watcher) poolChanged(o any) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return
	}
	spec, err := ParseSpec(u)
	if err != nil {
		// A pool we cannot read selects nothing: serving a stale selector
		// would route to pods the operator took out.
		w.setSpec(nil, err.Error())
		return
	}
	w.setSpec(&spec, "")
}

func (w *Watcher) setSpec(spec *Spec, why string) {
	w.mu.Lock()
	changed := !sameSpec(w.spec, spec)
	w.spec = spec
	w.mu.Unlock()
	if !changed {
		return
	}
	if spec == nil {
		w.log.Warn("InferencePool selects no pods", "reason", why)
	} else {
		w.log.Info("InferencePool read", "selector", spec.Selector, "target_ports", spec.Ports)
	}
	w.resyncAll()
}

func sameSpec(a, b *Spec) bool {
	if a == nil || b == nil {
		return a == b
	}
	if !slices.Equal(a.Ports, b.Ports) || len(a.Selector) != len(b.Selector) {
		return false
	}
	for k, v := range a.Selector {
		if bv, ok := b.Selector[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

// resyncAll recomputes every pod's workers from the informer's cache.
func (w *Watcher) resyncAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pods == nil {
		return
	}
	pods, err := w.pods.List(labels.Everything())
	if err != nil {
		w.log.Warn("listing cached pods", "err", err)
		return
	}
	present := make(map[string]bool, len(pods))
	for _, p := range pods {
		present[p.Name] = true
		w.applyLocked(p.Name, p)
	}
	for name := range w.known {
		if !present[name] {
			w.applyLocked(name, nil)
		}
	}
}

func (w *Watcher) podChanged(o any) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.applyLocked(p.Name, p)
}

func (w *Watcher) podDeleted(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	p, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.applyLocked(p.Name, nil)
}

// applyLocked makes the Sink hold exactly pod's workers (none for nil).
func (w *Watcher) applyLocked(name string, p *corev1.Pod) {
	var want []fleet.Worker
	if p != nil && w.spec != nil {
		var err error
		if want, err = Workers(p, *w.spec, w.cfg.Defaults); err != nil {
			w.log.Warn("pod serves nothing", "pod", name, "err", err)
			w.obs.BadRecord(name, err)
			want = nil
		}
	}
	old := w.known[name]
	for _, o := range old {
		if !slices.ContainsFunc(want, func(n fleet.Worker) bool { return n.ID == o.ID }) {
			w.sink.Remove(o.ID)
		}
	}
	for _, n := range want {
		i := slices.IndexFunc(old, func(o fleet.Worker) bool { return o.ID == n.ID })
		if i < 0 || !sameWorker(old[i], n) {
			w.sink.Upsert(n)
		}
	}
	if len(want) == 0 {
		delete(w.known, name)
	} else {
		w.known[name] = want
	}
}

func sameWorker(a, b fleet.Worker) bool {
	return a.ID == b.ID && a.Model == b.Model && a.Address == b.Address && a.BlockSize == b.BlockSize &&
		a.KVTotalBlocks == b.KVTotalBlocks && a.DPRank == b.DPRank
}

// probe asks the API server for its version (GET /version, which every
// authenticated client may read).
func (w *Watcher) probe(ctx context.Context) error {
	if err := w.kube.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Error(); err != nil {
		return fmt.Errorf("kubernetes API server: %w", err)
	}
	return nil
}
