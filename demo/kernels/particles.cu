/*
 * The demo's simulation step: particles in the unit box fall under gravity and
 * bounce off the walls. Edit this file while `make demo` runs and save it: the
 * running program picks the new version up at its next idle moment.
 *
 * Each particle is one float4: position in x, y and velocity in z, w. Keep the
 * kernel's name and parameters as they are in every version; hotkern refuses a
 * version whose parameter layout changed, and the old one keeps running.
 */
extern "C" {

/* Launch counter. hotkern copies same-named globals into each new version, so
 * this keeps counting across swaps instead of starting again from zero. */
__device__ unsigned long long steps;

__global__ void step(float4 *p, int n, float dt, float t) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0)
        steps += 1;
    if (i >= n)
        return;
    float4 q = p[i];
    q.w -= 1.5f * dt; /* gravity */
    q.x += q.z * dt;
    q.y += q.w * dt;
    /* Walls reflect; the floor takes a little energy away. */
    if (q.x < 0.0f) {
        q.x = -q.x;
        q.z = -q.z;
    }
    if (q.x > 1.0f) {
        q.x = 2.0f - q.x;
        q.z = -q.z;
    }
    if (q.y < 0.0f) {
        q.y = -q.y;
        q.w = -q.w * 0.98f;
    }
    if (q.y > 1.0f) {
        q.y = 2.0f - q.y;
        q.w = -q.w;
    }
    p[i] = q;
}
}
