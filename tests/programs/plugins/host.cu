// A host that loads effect plugins (libplug_a.so, libplug_b.so, in its directory)
// with dlopen and runs the loaded one every frame; CTLDIR/plugin names the
// plugin to run (plug_a by default): when it changes, the host dlcloses the
// one it has and dlopens the other.
#include <dlfcn.h>
#include <unistd.h>

#include <vector>

#include "../prog.h"

struct plugin {
    void *so = nullptr;
    std::string name;
    int (*file)() = nullptr;
    cudaError_t (*apply)(float *, int, cudaStream_t) = nullptr;
};

static bool load(plugin *p, const std::string &dir, const std::string &name) {
    std::string path = dir + "/lib" + name + ".so";
    p->so = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!p->so) {
        prog::bad("host", "dlopen %s: %s", path.c_str(), dlerror());
        return false;
    }
    p->file = (int (*)())dlsym(p->so, "plugin_file");
    p->apply = (cudaError_t(*)(float *, int, cudaStream_t))dlsym(p->so, "plugin_apply");
    if (!p->file || !p->apply) {
        prog::bad("host", "%s lacks plugin_file or plugin_apply", path.c_str());
        dlclose(p->so);
        p->so = nullptr;
        return false;
    }
    p->name = name;
    printf("loaded %s (file %d) at frame %ld\n", name.c_str(), p->file(), prog::frame());
    prog::seen_reset((name + ".apply").c_str());
    return true;
}

static void unload(plugin *p) {
    if (!p->so)
        return;
    CUDA_CHECK(cudaDeviceSynchronize());
    if (dlclose(p->so))
        prog::bad("host", "dlclose %s: %s", p->name.c_str(), dlerror());
    printf("unloaded %s at frame %ld\n", p->name.c_str(), prog::frame());
    *p = plugin();
}

int main(int argc, char **argv) {
    prog::start(argc, argv, "plugins");
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    self[len > 0 ? len : 0] = '\0';
    std::string dir = self;
    dir = dir.substr(0, dir.rfind('/'));
    const int n = 1 << 14;
    std::vector<float> h(n);
    float *d;
    CUDA_CHECK(cudaMalloc(&d, n * sizeof(float)));
    plugin p;
    prog::started("plugins");
    while (prog::running()) {
        std::string want = prog::flag_text("plugin");
        if (want.empty())
            want = "plug_a";
        if (want != p.name) {
            unload(&p);
            if (!load(&p, dir, want))
                break;
        }
        CUDA_CHECK(cudaMemset(d, 0xff, n * sizeof(float)));
        CUDA_CHECK(p.apply(d, n, 0));
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
        prog::check((p.name + ".apply").c_str(), h.data(), n, p.file(),
                    [](int i) { return i % 97; });
        prog::frame_end();
    }
    unload(&p);
    CUDA_CHECK(cudaFree(d));
    return prog::finish();
}
