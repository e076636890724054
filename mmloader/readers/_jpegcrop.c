/* mmloader.readers._jpegcrop: decode only the part of a JPEG that a crop keeps.

   libjpeg-turbo's jpeg_crop_scanline() limits the inverse DCT, upsampling and colour conversion
   to the iMCU columns around the box, and jpeg_skip_scanlines() skips the rows above it; the
   rows below are entropy-decoded only (jpeg_skip_scanlines again), so that corrupt or truncated
   data anywhere in the file is still noticed (any libjpeg warning fails the call, as the strict
   full decode does). The pixels equal a full decode's (the box keeps a margin from the cropped
   region's edges, where the upsampler would see an edge the full image does not have). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>

#define CHUNK 16

struct err_mgr {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
};

static void on_error(j_common_ptr cinfo) {
    struct err_mgr *e = (struct err_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, e->msg);
    longjmp(e->jump, 1);
}

static void on_warning(j_common_ptr cinfo) { (void)cinfo; }

/* The sampling factors TurboJPEG (simplejpeg, every other path) decodes: grayscale, or colour
   with full-resolution chroma and luma at 1x1, 2x1, 2x2, 1x2, 4x1 or 1x4. */
static int usual_sampling(struct jpeg_decompress_struct *cinfo) {
    if (cinfo->num_components == 1)
        return 1;
    if (cinfo->num_components != 3)
        return 0;
    for (int i = 1; i < 3; i++)
        if (cinfo->comp_info[i].h_samp_factor != 1 || cinfo->comp_info[i].v_samp_factor != 1)
            return 0;
    int h = cinfo->comp_info[0].h_samp_factor, v = cinfo->comp_info[0].v_samp_factor;
    return (h == 1 && v == 1) || (h == 2 && v == 1) || (h == 2 && v == 2) || (h == 1 && v == 2) ||
           (h == 4 && v == 1) || (h == 1 && v == 4);
}

/* 0: done; 1: libjpeg error (msg set); 2: box outside the scaled image; 3: out of memory;
   4: the data raised a warning (corrupt or truncated); 5: sampling factors the full decode refuses */
static int decode_box(const unsigned char *data, unsigned long size, int eighths, int top, int left, int h, int w,
                      unsigned char *out, struct err_mgr *jerr) {
    struct jpeg_decompress_struct cinfo;
    JSAMPROW volatile row = NULL;
    int status = 0;
    cinfo.err = jpeg_std_error(&jerr->pub);
    jerr->pub.error_exit = on_error;
    jerr->pub.output_message = on_warning;
    jpeg_create_decompress(&cinfo);
    if (setjmp(jerr->jump)) {
        free(row);
        jpeg_destroy_decompress(&cinfo);
        return 1;
    }
    jpeg_mem_src(&cinfo, data, size);
    jpeg_read_header(&cinfo, TRUE);
    if (!usual_sampling(&cinfo)) { /* what the full decode (TurboJPEG) refuses: refused here too */
        jpeg_destroy_decompress(&cinfo);
        return 5;
    }
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = (unsigned int)eighths;
    cinfo.scale_denom = 8;
    jpeg_start_decompress(&cinfo);
    if (top < 0 || left < 0 || h < 1 || w < 1 || (JDIMENSION)(top + h) > cinfo.output_height ||
        (JDIMENSION)(left + w) > cinfo.output_width) {
        status = 2;
    } else {
        /* A margin on both sides where the image has it: the upsampler treats the cropped
           region's first and last columns as the image's edges, which changes those columns. */
        JDIMENSION x = left > 0 ? (JDIMENSION)left - 1 : 0, width = (JDIMENSION)(left - (int)x) + (JDIMENSION)w + 16;
        if (x + width > cinfo.output_width)
            width = cinfo.output_width - x;
        if (x > 0 || width < cinfo.output_width)
            jpeg_crop_scanline(&cinfo, &x, &width);
        row = (JSAMPROW)malloc((size_t)width * 3 * CHUNK);
        if (row == NULL) {
            status = 3;
        } else {
            if (top > 0)
                jpeg_skip_scanlines(&cinfo, (JDIMENSION)top);
            size_t shift = (size_t)(left - (int)x) * 3, line = (size_t)w * 3;
            JSAMPROW rows[CHUNK];
            for (int i = 0; i < CHUNK; i++)
                rows[i] = row + (size_t)i * width * 3;
            for (int r = 0; r < h;) {
                int want = h - r < CHUNK ? h - r : CHUNK;
                int got = (int)jpeg_read_scanlines(&cinfo, rows, (JDIMENSION)want);
                for (int i = 0; i < got; i++, r++)
                    memcpy(out + (size_t)r * line, rows[i] + shift, line);
                if (got == 0) break;
            }

            /* The rows under the box: entropy-decoded, not output. Not skipped to the very end,
               which libjpeg-turbo does without reading the data: the last row is read. */
            if (cinfo.output_height - cinfo.output_scanline > 1)
                jpeg_skip_scanlines(&cinfo, cinfo.output_height - cinfo.output_scanline - 1);
            while (cinfo.output_scanline < cinfo.output_height)
                if (jpeg_read_scanlines(&cinfo, rows, 1) == 0) break;
            jpeg_finish_decompress(&cinfo);
            if (jerr->pub.num_warnings) status = 4;

        }
    }
    free(row);
    jpeg_destroy_decompress(&cinfo); /* the rows under the box are never decoded */
    return status;
}

static PyObject *decode_crop(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    int eighths, top, left, h, w, status;
    struct err_mgr jerr;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iiiiiw*", &src, &eighths, &top, &left, &h, &w, &dst))
        return NULL;
    if (eighths < 1 || eighths > 8 || h < 1 || w < 1 || dst.len < (Py_ssize_t)h * w * 3) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        PyErr_SetString(PyExc_ValueError, "decode_crop: eighths in 1..8 and an output of h * w * 3 bytes");
        return NULL;
    }
    jerr.msg[0] = 0;
    Py_BEGIN_ALLOW_THREADS
    status = decode_box((const unsigned char *)src.buf, (unsigned long)src.len, eighths, top, left, h, w,
                        (unsigned char *)dst.buf, &jerr);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (status == 1)
        return PyErr_Format(PyExc_ValueError, "JPEG decode failed: %s", jerr.msg);
    if (status == 2)
        return PyErr_Format(PyExc_ValueError, "decode_crop: box (%d, %d, %d, %d) outside the image at %d/8", top, left,
                            h, w, eighths);
    if (status == 3)
        return PyErr_NoMemory();
    if (status == 4)
        return PyErr_Format(PyExc_ValueError, "JPEG data corrupt or truncated");
    if (status == 5)
        return PyErr_Format(PyExc_ValueError, "JPEG sampling factors the full decoder does not take");
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_crop", decode_crop, METH_VARARGS,
     "decode_crop(data, eighths, top, left, h, w, out): the box of the JPEG decoded at eighths/8 scale into out "
     "(h x w x 3 uint8), decoding no row below it and no iMCU column outside it."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegcrop", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpegcrop(void) { return PyModule_Create(&module); }
