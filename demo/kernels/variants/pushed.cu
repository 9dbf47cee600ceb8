/*
 * Tour variant, sent over the network with `hotkern push`: every particle is
 * pulled towards the centre of the box and loses speed, so the cloud
 * contracts into a pulsing disc. Same kernel name, parameters and globals as
 * particles.cu.
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
    /* A spring towards the centre whose strength breathes with time t. */
    float k = 6.0f + 3.0f * __sinf(2.0f * t);
    q.z = (q.z - k * dx * dt) * 0.985f;
    q.w = (q.w - k * dy * dt) * 0.985f;
    q.x = fminf(fmaxf(q.x + q.z * dt, 0.0f), 1.0f);
    q.y = fminf(fmaxf(q.y + q.w * dt, 0.0f), 1.0f);
    p[i] = q;
}
}
