/*
 * Tour variant: a save with a mistake in it. The statement that updates the
 * x velocity lacks its semicolon, so NVRTC refuses the file; hotkern reports
 * the compiler log and the running version is not touched.
 */
extern "C" {

__device__ unsigned long long steps;

__global__ void step(float4 *p, int n, float dt, float t) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0)
        steps += 1;
    if (i >= n)
        return;
    float4 q = p[i];
    float dx = q.x - 0.5f, dy = q.y - 0.5f;
    q.z += (-6.0f * dy - 2.0f * dx) * dt
    q.w += (6.0f * dx - 2.0f * dy) * dt;
    q.x += q.z * dt;
    q.y += q.w * dt;
    p[i] = q;
}
}
